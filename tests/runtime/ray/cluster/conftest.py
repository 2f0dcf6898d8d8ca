"""The ``ray`` runtime's cluster tests (marker ``ray``): collected only when ``-m`` can select
them, so that ``python -m pytest`` (``-m 'not ... ray ...'``) never imports ray; and the
module-scoped two-node loopback Ray cluster they share.

The ``ray`` runtime's tests that need no cluster are in the main suite:
``tests/runtime/ray/test_ray_preflight.py`` and ``tests/runtime/ray/test_ray_dispatch.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.mark.expression import Expression

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster


def _selects_ray(config: pytest.Config) -> bool:
    """Whether the run's marker expression (``-m``) keeps a test marked ``ray``."""
    expr = str(config.getoption("markexpr") or "")
    if not expr.strip():
        return True

    def matcher(name: str, /, **kwargs: Any) -> bool:
        return name == "ray" and not kwargs

    return Expression.compile(expr).evaluate(matcher)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip importing this folder's modules (they import ray) when no ``ray`` test would run."""
    if collection_path.name.startswith("test_") and not _selects_ray(config):
        return True
    return None


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """Head and one worker node (two nodes, one CPU each; the worker labelled
    ``tracerl-pool=agents``), shared by the module's tests."""
    from tests.runtime.ray.cluster.ray_test_cluster import start_cluster, stop_cluster

    cluster = start_cluster(workers=1, labels={"tracerl-pool": "agents"})
    try:
        yield cluster
    finally:
        stop_cluster(cluster)

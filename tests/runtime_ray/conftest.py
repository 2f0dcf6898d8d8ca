"""The module-scoped two-node loopback Ray cluster of the ``ray`` runtime's tests (marker ``ray``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray.cluster_utils import Cluster
from ray_test_cluster import start_cluster, stop_cluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """Head and one worker node (two nodes, one CPU each; the worker labelled
    ``tracerl-pool=agents``), shared by the module's tests."""
    cluster = start_cluster(workers=1, labels={"tracerl-pool": "agents"})
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


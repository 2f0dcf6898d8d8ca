"""Core-loop runs that the tests of several remote backends (Tinker, SageMaker) share.

Each backend's tests fake its service at the network edge and compose their own
config (``make_cfg(run_dir, *overrides) -> (cfg, plugins)``); the run and what it
must show are the same for all of them:

- ``check_async_within_staleness``: ``trainer.mode=async`` trains while rollouts
  run, and the sampler reports the weight version each request started on, so
  staleness is measured and stays within ``trainer.max_staleness``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

ASYNC_OVERRIDES = (
    "trainer.max_steps=3",
    "trainer.save_every=0",
    "trainer.canary=false",
    "trainer.mode=async",
    "trainer.max_staleness=1",
)
"""Three async steps, at most one weight version stale, no checkpoints."""


def check_async_within_staleness(make_cfg: Callable[..., tuple[Any, Any]], run_dir: Path, *extra: str) -> None:
    """Train ``ASYNC_OVERRIDES`` plus ``extra`` and check the staleness metrics.

    ``extra`` must pick an agent whose every group has a signal (random rewards), so
    every step trains and moves the weight version.
    """
    from core.rundir.metrics import read_metrics
    from core.trainer.loop import Trainer

    cfg, plugins = make_cfg(run_dir, *ASYNC_OVERRIDES, *extra)
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    records = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["weight_version"] for r in records] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 for r in records)
    # both first groups sampled on version 0; the second step trains on version 1
    assert records[1]["async/staleness_max"] == 1

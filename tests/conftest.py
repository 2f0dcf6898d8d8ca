"""Settings for this repository's own test run (third parties get core.testing.pytest_plugin)."""

from __future__ import annotations

import os

import pytest

MAX_AUTO_WORKERS = 4
"""README's ``python -m pytest -n auto`` uses one worker per core, at most this many: each
worker's tests start servers, agent processes and trainers of their own, and past a few
workers a larger machine buys little time for the memory and the load it costs."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """pytest-xdist's ``-n auto``: the cores this process may use, capped at ``MAX_AUTO_WORKERS``."""
    return max(1, min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0))))

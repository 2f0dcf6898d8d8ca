"""Every finished rollout is accounted in ``trainer.mode=async`` (issue #28), in the
slow-failure scenario (``slow_failures``) on the real ``RolloutPool``."""

from __future__ import annotations

import asyncio

from slow_failures import drive, failure_rate

from core.trainer.guards import check_failures


def test_the_failure_guard_sees_the_true_failure_rate_when_failures_are_slow() -> None:
    seen = asyncio.run(drive(steps=12, batch=4, group=4, max_staleness=1))
    runner = seen.runner
    assert runner is not None
    wasted_at_end = seen.end["async/wasted_rollouts"]
    # Every rollout that finished is either accounted by a step or wasted at the end.
    assert len(seen.accounted) + wasted_at_end == len(runner.finished)
    guard = [check_failures([*b.outcomes, *b.untrained], step=i, max_failure_rate=1.0)
             for i, b in enumerate(seen.batches)]
    guard_failed = sum(n for c in guard for s, n in c.items() if s != "ok")
    guard_total = sum(sum(c.values()) for c in guard)
    true_rate = failure_rate(seen.accounted)
    assert guard_failed / guard_total == true_rate
    # The scenario bites: counting only what trains would under-report failures.
    assert any(b.untrained for b in seen.batches)
    assert failure_rate(seen.trained) < true_rate
    # Whatever did not train is counted as wasted, with its status mix.
    for b in seen.batches:
        assert b.flow["async/wasted_rollouts"] == len(b.untrained)
        mix = {k.removeprefix("async/wasted/"): v for k, v in b.flow.items() if k.startswith("async/wasted/")}
        assert sum(mix.values()) == len(b.untrained)
    end_mix = sum(v for k, v in seen.end.items() if k.startswith("async/wasted/"))
    assert end_mix == wasted_at_end

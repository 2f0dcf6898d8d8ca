"""The metrics an agent returns with its reward reach the step's record as ``agent/<name>``."""

from __future__ import annotations

from collections import Counter

from core.trainer.metrics import StepReport, StepTimes, agent_metrics, step_metrics
from core.types import RolloutStatus
from tests.rewards.test_reward_plugins import _outcome


def test_the_mean_over_ok_rollouts_under_their_own_prefix() -> None:
    outcomes = [_outcome(str(d), {"q": d}) for d in range(4)]
    for d, o in enumerate(outcomes):
        o.result.metrics.update({"turns": float(d), "tool_calls": 2.0})
    outcomes[3].result.metrics.pop("tool_calls")  # a metric only some rollouts carry
    failed = _outcome("x", {"q": 9}, status=RolloutStatus.CRASHED)
    failed.result.metrics.update({"turns": 100.0})  # a failed rollout's metrics are left out, as its reward is
    assert agent_metrics([*outcomes, failed]) == {"agent/tool_calls": 2.0, "agent/turns": 1.5}


def test_an_agent_cannot_overwrite_the_loop_s_keys() -> None:
    """Every name is prefixed, so ``reward/mean``-like or ``rollouts/ok``-like names land under
    ``agent/``; the agent's ``reward/<component>`` keys are component_metrics' (never reward/mean)."""
    outcomes = [_outcome(str(d), {"q": d}) for d in range(2)]
    for o in outcomes:
        o.result.metrics.update({"rollouts/ok": 99.0, "step": 7.0, "reward/mean": 0.99, "nan": float("nan")})
    report = StepReport(
        step=1, outcomes=outcomes, statuses=Counter({"ok": 2}), datums=[], metrics={},
        times=StepTimes(), step_time=1.0, weight_version=0, data={},
    )
    record = step_metrics(report)
    assert record["step"] == 1 and record["rollouts/ok"] == 2 and record["reward/mean"] == 0.25
    assert record["agent/rollouts/ok"] == 99.0 and record["agent/step"] == 7.0
    assert not any(key.startswith("agent/reward") or key == "agent/nan" for key in record)

"""Several policies in ``trainer.mode=async`` (docs/multi_agent.md, issue #34): every turn is
aged against its own policy's weight version, for the staleness metrics, a group's age and the
hard per-token bound; each policy's weights are pushed to its own local sampler while
rollouts are in flight; checkpoints hold every policy and the pool's groups, and a resumed
run starts from both.

Real local torch backend (tiny model) per policy, real gateway, the two-role task's agents
in a local-runtime process (tests/trainer/loop_agents.py); a few steps, so what is asserted
is mechanics, not learning.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from test_multi_policy import HERE, TWO, _cfg, _train

from core.rollout import RolloutOutcome
from core.rundir.checkpoint import STATE_FILE, checkpoint_dir
from core.rundir.metrics import read_metrics
from core.trainer.loop import Trainer
from core.trainer.signal import StepSignal

ASYNC = ["trainer.mode=async", "trainer.max_staleness=1"]
UP_ONLY = [
    "task.agent=loop_agents:two_roles_up_only",
    f"+task.agent_env.PYTHONPATH={HERE}",
    "algorithm.loss_config.entropy_coef=0",  # the recipe's entropy bonus would step down too
]
"""Role ``up`` scored by reply parity (a signal in most groups), ``down`` always 1.0 (none)."""
PARITY = ["task.agent=loop_agents:two_roles_parity", f"+task.agent_env.PYTHONPATH={HERE}"]


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, int], list[RolloutOutcome]]]:
    """Per step: each policy's version when its datums were built, and the rollouts they were
    built from (after the hard bound made stale turns context). A read-only spy."""
    seen: list[tuple[dict[str, int], list[RolloutOutcome]]] = []
    original = Trainer._signal

    def spy(self: Trainer, outcomes: list[RolloutOutcome]) -> StepSignal:
        seen.append((self.policies.versions(), list(outcomes)))
        return original(self, outcomes)

    monkeypatch.setattr(Trainer, "_signal", spy)
    return seen


@pytest.mark.integration
def test_a_policy_that_does_not_step_does_not_age_its_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``up`` steps, ``down`` never does (no signal): down's turns, all sampled at version 0,
    are 0 steps old however far up (the default policy) has moved. With
    ``max_staleness_per_token=0`` only up's turns older than up's own version become context;
    aged against up's version, every down turn would be masked from the second update on."""
    seen = _capture(monkeypatch)
    run_dir = tmp_path / "run"
    trainer = _train(*_cfg(run_dir, *TWO, *UP_ONLY, *ASYNC, "trainer.max_staleness_per_token=0",
                           "trainer.max_steps=4"))
    records = _steps(run_dir)
    assert len(records) == 4 and len(seen) == 4
    up_steps = sum(isinstance(r.get("policy/up/loss"), float) for r in records)
    assert trainer.policies.versions() == {"up": up_steps, "down": 0} and up_steps >= 2

    masked_up = stale_up = 0
    for (versions, outcomes), record in zip(seen, records, strict=True):
        assert versions["down"] == 0
        step_masked = 0
        for o in outcomes:
            for row in o.rows:
                for turn in row.turns:
                    mask = row.loss_mask[turn.start : turn.end]
                    if turn.policy == "down":
                        assert turn.weight_version == 0 and all(mask), "a down turn was aged by up's version"
                        continue
                    assert turn.policy == "up" and turn.weight_version <= versions["up"]
                    stale = turn.weight_version < versions["up"]
                    assert all(m == (0 if stale else 1) for m in mask)
                    stale_up += stale
                    step_masked += len(mask) if stale else 0
        masked_up += step_masked
        assert record["async/masked_stale_tokens"] == step_masked
        # Per-policy staleness, and the step's (per rollout, per token, per group) read each
        # turn against its own policy: down's are 0, so the step's are up's.
        assert record["policy/down/staleness_max"] == 0 and record["policy/down/weight_version"] == 0
        assert record["policy/up/weight_version"] == versions["up"] + isinstance(record.get("policy/up/loss"), float)
        assert record["async/staleness_max"] == record["policy/up/staleness_max"]
        assert record["async/token_staleness_max"] == record["policy/up/staleness_max"]
        assert record["async/group_staleness_max"] == record["async/staleness_max"]
        assert record["policy/up/rollouts"] == record["policy/down/rollouts"] == 8
    # max_staleness=1 lets the second batch start on the first weights: some up turns
    # trained one update late, and only those were masked.
    assert stale_up > 0 and masked_up == stale_up
    assert any(r["policy/up/staleness_max"] >= 1 for r in records)


@pytest.mark.integration
def test_async_two_policies_checkpoint_both_and_resume(tmp_path: Path) -> None:
    """Two policies that both step, in async: per-policy metrics every step, each policy's
    checkpoint beside the pool's groups in flight; a resumed run restores every policy's
    version and runs those groups again first."""
    run_dir = tmp_path / "run"
    first = _train(*_cfg(run_dir, *TWO, *PARITY, *ASYNC))
    saved = first.policies.versions()
    state = json.loads((checkpoint_dir(run_dir, 2) / STATE_FILE).read_text())
    assert set(state["policies"]) == {"up", "down"}
    for policy in ("up", "down"):
        assert (checkpoint_dir(run_dir, 2) / "backend" / policy / "state.pt").is_file()
    pending = state["async"]["pending"]
    assert pending  # max_staleness=1: the next batch was in flight when the run ended
    for r in _steps(run_dir):
        for policy in ("up", "down"):
            assert r[f"policy/{policy}/rollouts"] == 8
            assert math.isfinite(r[f"policy/{policy}/staleness_mean"]) and r[f"policy/{policy}/staleness_max"] >= 0
            assert r[f"policy/{policy}/weight_version"] >= 0

    resumed = Trainer(*_cfg(run_dir, *TWO, *PARITY, *ASYNC, "trainer.resume=true", "trainer.max_steps=4"))
    loaded: dict[str, int] = {}
    original = resumed._start_source

    def spy() -> Any:
        loaded.update(resumed.policies.versions())  # after every policy's checkpoint loaded
        return original()

    resumed._start_source = spy  # type: ignore[method-assign]
    assert asyncio.run(resumed.run()) == 0
    assert loaded == saved
    records = _steps(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2]["async/rerun_on_resume"] == len(pending)
    for policy in ("up", "down"):
        trained = sum(isinstance(r.get(f"policy/{policy}/loss"), float) for r in records[2:])
        assert resumed.policies.versions()[policy] == saved[policy] + trained
        assert records[3][f"policy/{policy}/weight_version"] == saved[policy] + trained

"""Agent faults during real training steps: an agent process killed mid-turn, a sync
handler that hangs for good, rewards that are not usable numbers.

Real gateway over HTTP, real local runtime with agent processes
(``fault_agents``), the real ``Trainer`` loop; only the policy is the recording
``FakeBackend``. Each test asserts the rollout's status, the step's metrics,
that the run goes on, and that nothing of a failed rollout reached
``forward_backward``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from core.types import RolloutStatus
from tests.faults.harness import (
    LoopSpy,
    assert_metrics_match,
    assert_trained_only_ok,
    fault_config,
    hook_sampler,
    run_loop,
    statuses,
    step_records,
)

pytestmark = pytest.mark.integration


def test_agent_killed_mid_turn_is_crashed_and_not_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent makes two model calls; SIGKILL its process while the second one is
    inside the gateway (the hook runs in that sampler call). The orphaned turn is never
    recorded; the first turn is, but the rollout is ``crashed`` and none of it trains.
    The other agent process serves on."""
    spy = LoopSpy().install(monkeypatch)
    victim: dict[str, object] = {}
    calls: Counter[str] = Counter()

    async def kill_during_a_second_call_of_step_2(prompt: Sequence[int], session_id: str) -> None:
        calls[session_id] += 1
        if spy.current_step == 2 and calls[session_id] == 2 and not victim:
            pid = int((tmp_path / f"{session_id}.pid").read_text())
            victim.update(session=session_id, pid=pid)
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(10)  # cancelled once the gateway sees the client gone

    hook_sampler(monkeypatch, kill_during_a_second_call_of_step_2)
    cfg, plugins = fault_config(
        tmp_path,
        "runtime.num_processes=2",
        "trainer.group_size=4",  # with groups of 2, all four of steps 1 and 3 are constant 1 time in 16
        "trainer.max_failure_rate=0.75",
        agent="fault_agents:two_turns",
    )
    code, backend = run_loop(cfg, plugins)
    assert code == 0 and victim, "the run went on to its end"

    step2 = spy.step(2).outcomes
    mine = next(o for o in step2 if o.request.session_id == victim["session"])
    assert mine.result.status is RolloutStatus.CRASHED
    assert f"pid {victim['pid']}" in (mine.result.error or "") and "mid-rollout" in (mine.result.error or "")
    # the first turn was recorded (there is something to leave out); the second was not:
    # cancelled as disconnected, or still in flight when the runner closed the session,
    # whichever the gateway and the runtime noticed first
    assert mine.faults["model_turns"] == 1
    assert mine.faults["disconnected_turns"] + mine.faults["in_flight_at_finish"] == 1, mine.faults
    assert len(mine.rows) == 1 and mine.rows[0].status is RolloutStatus.CRASHED
    crashed = [o for o in step2 if o.result.status is RolloutStatus.CRASHED]
    # only the rollouts on the killed process (of two) crashed
    assert 1 <= len(crashed) < len(step2), statuses(step2)
    records = step_records(cfg_run_dir(cfg))
    assert sorted(records) == [1, 2, 3]
    for n in (1, 2, 3):
        assert_metrics_match(records[n], spy.step(n).outcomes)
    assert records[2]["rollouts/crashed"] == len(crashed) >= 1
    assert records[2]["rollouts/excluded_failed"] == len(crashed)
    assert records[2]["faults/disconnected_turns"] + records[2]["faults/in_flight_at_finish"] >= 1
    assert statuses(spy.step(3).outcomes) == ["ok"] * 8, "the pool kept serving"
    assert assert_trained_only_ok(spy, backend), "some step trained"


def cfg_run_dir(cfg: object) -> Path:
    return Path(str(cfg.run_dir))  # type: ignore[attr-defined]


def test_hung_sync_handler_times_out_and_the_process_is_recycled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One handler thread (``TRACERL_AGENT_THREADS=1``), one rollout at a time: the first
    rollout's sync handler makes its model call, then blocks for good. It times out,
    the runtime finds the pool exhausted by an abandoned handler and recycles the
    process, and every later rollout runs on the fresh process."""
    spy = LoopSpy().install(monkeypatch)
    cfg, plugins = fault_config(
        tmp_path,
        "+task.agent_env.TRACERL_AGENT_THREADS='1'",
        "trainer.max_concurrent_rollouts=1",
        "trainer.rollout_timeout_s=2",
        "trainer.group_size=3",
        "trainer.max_steps=2",
        agent="fault_agents:sync_hang",
    )
    code, backend = run_loop(cfg, plugins)
    assert code == 0
    hung_pid = int((tmp_path / "hang.claimed").read_text())

    step1 = spy.step(1).outcomes
    assert statuses(step1) == ["ok"] * 5 + ["timeout"]
    hung = next(o for o in step1 if o.result.status is RolloutStatus.TIMEOUT)
    assert "2s timeout" in (hung.result.error or "")
    assert hung.faults["model_turns"] == 1, "it timed out after a model call (a broken turn)"
    later = [o for o in spy.step(1).outcomes + spy.step(2).outcomes if o.ok]
    assert len(later) == 11
    assert all(o.result.metrics["pid"] != hung_pid for o in later), "they ran on the fresh process"
    assert spy.trainer is not None
    (proc,) = spy.trainer.runtime.processes
    assert (proc.recycles, proc.restarts) == (1, 0)

    records = step_records(cfg_run_dir(cfg))
    for n in (1, 2):
        assert_metrics_match(records[n], spy.step(n).outcomes)
    assert records[1]["rollouts/timeout"] == 1 and records[2]["rollouts/ok"] == 6
    assert assert_trained_only_ok(spy, backend), "some step trained"


def _write_rows(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps({"payload": r}) + "\n" for r in rows))


def test_unusable_rewards_are_invalid_and_the_group_maths_stay_finite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one step, the first rollout of each of four groups returns NaN, a 401-digit
    integer, 1e200 or the string "0.5"; its four group mates return real rewards."""
    data = tmp_path / "bad.jsonl"
    kinds = ["nan", "int400", "1e200", "string"]
    _write_rows(data, [{"n": n, "answer": str(n + 1), "bad": k} for n, k in enumerate(kinds)])
    # groups of 5: one bad reward and four real ones (all four groups constant ~1 in 4000)
    spy = LoopSpy().install(monkeypatch)
    cfg, plugins = fault_config(
        tmp_path,
        f"task.train_path={data}",
        "trainer.batch_size=4",
        "trainer.group_size=5",
        "trainer.max_steps=2",
        agent="fault_agents:bad_rewards",
    )
    code, backend = run_loop(cfg, plugins)
    assert code == 0

    step1 = spy.step(1).outcomes
    invalid = {
        o.request.payload["bad"]: o for o in step1 if o.result.status is RolloutStatus.INVALID_REWARD
    }
    assert sorted(invalid) == sorted(kinds), statuses(step1)
    assert "nan" in (invalid["nan"].result.error or "")
    assert "1329 bits" in (invalid["int400"].result.error or ""), invalid["int400"].result.error
    assert "max_abs_reward" in (invalid["1e200"].result.error or "")
    assert "'0.5'" in (invalid["string"].result.error or "")
    assert all(o.result.reward is None and all(r.reward is None for r in o.rows) for o in invalid.values())
    assert sum(o.ok for o in step1) == 16

    records = step_records(cfg_run_dir(cfg))
    assert_metrics_match(records[1], step1)
    assert records[1]["rollouts/invalid_reward"] == 4
    assert records[2]["rollouts/ok"] == 20, "later rollouts of the same rows are fine"
    for r in records.values():
        for key in ("reward/mean", "reward/std"):
            assert math.isfinite(r[key]), (key, r[key])
    signal1 = spy.step(1).signal
    assert signal1 is not None
    assert all(math.isfinite(a) for a in signal1.advantages.values())
    assert not {o.request.rollout_id for o in invalid.values()} & set(signal1.advantages)
    assert signal1.has_signal, "the bad rewards' group mates trained"
    assert_trained_only_ok(spy, backend)

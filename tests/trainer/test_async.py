"""``trainer.mode=async``: the staleness bound, dropped groups, idle times and exact
resume, with the recording fake backend (no torch), the real gateway and the local
runtime's agent processes. Each turn's weight version comes from the fake sampler,
which reports the version of the weights it was built for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_loop import _cfg, _train

from core.errors import ConfigError
from core.testing.fakes import CREATED
from core.trainer.checkpoint import latest_checkpoint
from core.trainer.data import DataOrder
from core.trainer.loop import Trainer
from core.trainer.metrics import console_line, read_metrics
from core.trainer.rollouts import RolloutOutcome
from core.trainer.signal import StepSignal

ROWS = 40


def _write_rows(path: Path, delays: dict[int, float], base_delay: float = 0.0) -> None:
    """``ROWS`` succ_digit payloads; row i waits ``delays.get(i, base_delay)`` seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(ROWS):
        payload = {"n": i % 10, "answer": str((i + 1) % 10), "delay_s": delays.get(i, base_delay)}
        lines.append(json.dumps({"payload": payload}) + "\n")
    path.write_text("".join(lines))


def _record_versions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int]]]:
    """Per trained step: the backend's weight version when its datums were built, and
    the weight version of every generated turn of the rollouts that train (read-only spy)."""
    seen: list[tuple[int, list[int]]] = []
    original = Trainer._signal

    def spy(self: Trainer, outcomes: list[RolloutOutcome]) -> StepSignal:
        versions = [t.weight_version for o in outcomes if o.ok for r in o.rows for t in r.turns]
        seen.append((int(self.backend.weight_version), versions))
        return original(self, outcomes)

    monkeypatch.setattr(Trainer, "_signal", spy)
    return seen


def _steps(trainer: Trainer) -> list[dict[str, Any]]:
    return [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]


@pytest.mark.integration
def test_max_staleness_zero_trains_on_policy_like_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = _train(*_cfg(tmp_path / "sync", "trainer.max_steps=4"))
    seen = _record_versions(monkeypatch)
    CREATED.clear()
    run = _train(*_cfg(tmp_path / "async", "trainer.max_steps=4", "trainer.mode=async", "trainer.max_staleness=0"))
    assert len(seen) == 4
    for version, turns in seen:
        assert turns and set(turns) == {version}  # every trained token: the step's own weights
    records = _steps(run)
    # Same batches, in the same order, as the synchronous loop; nothing stale, nothing dropped.
    assert [r["data/batch"] for r in records] == [r["data/batch"] for r in _steps(sync)]
    assert all(r["async/staleness_max"] == 0 and r["async/dropped_stale"] == 0 for r in records)
    assert CREATED[-1].closed
    # The synchronous loop reports the same flow keys: it waits for every rollout, on-policy.
    for r in _steps(sync):
        assert r["async/staleness_max"] == 0 and r["time/trainer_idle"] == r["time/rollout"]
        assert r["rollouts/finished"] == 8 and r["rollouts/s"] > 0 and "stale" not in console_line(r)


@pytest.mark.integration
def test_long_tail_does_not_stall_steps_and_stale_groups_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first group started (seq 0) takes 2 s; the others 0.05 s. With
    max_staleness=1 the steps go on without it, and when it returns the weights have
    moved on by more than one step: it is dropped and counted, never trained."""
    slow = DataOrder(size=ROWS, seed=0).next_batch(1)[0]
    data = tmp_path / "tail.jsonl"
    _write_rows(data, {slow: 2.0}, base_delay=0.05)
    seen = _record_versions(monkeypatch)
    cfg, plugins = _cfg(
        tmp_path,
        f"task.train_path={data}",
        "trainer.mode=async",
        "trainer.max_staleness=1",
        "trainer.max_steps=30",
        "trainer.batch_size=2",
        "trainer.group_size=2",
        "trainer.loggers=[jsonl,console]",
        agent="loop_agents:long_tail",
    )
    run = _train(cfg, plugins)
    records = _steps(run)
    assert len(records) == 30
    for version, turns in seen:
        assert turns and min(turns) >= version - 1  # nothing trained beyond the bound
    assert max(r["async/staleness_max"] for r in records) <= 1
    assert any(r["async/staleness_max"] == 1 for r in records)  # it did train off-policy
    # The slow group never held a step up: no step waited anywhere near its 2 s.
    assert max(r["time/trainer_idle"] for r in records) < 1.2
    trained = [seq for r in records for seq in r["async/groups"]]
    assert 0 not in trained and len(trained) == len(set(trained)) == 60
    dropped = [seq for r in records for seq in r["async/dropped_groups"]]
    assert 0 in dropped and not set(dropped) & set(trained)  # (a loaded machine may drop more)
    assert sum(r["async/dropped_stale"] for r in records) == len(dropped)
    assert sum(r["async/dropped_stale_rollouts"] for r in records) == 2 * len(dropped)
    for r in records:
        assert r["rollouts/s"] >= 0 and r["time/sampler_idle"] >= 0
        assert "stale " in console_line(r)


@pytest.mark.integration
def test_killed_async_run_resumes_with_the_same_data_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed in step 3 (after the step-2 checkpoint, with groups in flight)
    resumes: the groups pending at the checkpoint run again (counted), the data
    order continues where the checkpoint left it, and no group is trained twice or lost."""
    data = tmp_path / "rows.jsonl"
    _write_rows(data, {}, base_delay=0.05)
    common = (
        f"task.train_path={data}",
        "trainer.mode=async",
        "trainer.max_staleness=1",
        "trainer.save_every=2",
        "trainer.batch_size=2",
        "trainer.group_size=2",
    )
    original = Trainer._train
    calls = {"n": 0}

    async def dies_in_step_3(self: Trainer, datums: Any) -> dict[str, float]:
        # Training takes a while, as on a real backend (the fake one never yields), so
        # the next groups start while it runs.
        await asyncio.sleep(0.1)
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("killed in step 3")
        return await original(self, datums)

    monkeypatch.setattr(Trainer, "_train", dies_in_step_3)
    cfg, plugins = _cfg(tmp_path, *common, "trainer.max_steps=5", agent="loop_agents:long_tail")
    with pytest.raises(RuntimeError, match="killed in step 3"):
        asyncio.run(Trainer(cfg, plugins).run())
    monkeypatch.setattr(Trainer, "_train", original)
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.step == 2
    pending = [tuple(p) for p in ckpt.state["async"]["pending"]]
    assert len(pending) == 2  # the next batch was in flight while step 2 trained

    cfg, plugins = _cfg(tmp_path, *common, "trainer.max_steps=5", "trainer.resume=true", agent="loop_agents:long_tail")
    resumed = _train(cfg, plugins)
    records = _steps(resumed)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[2]["async/rerun_on_resume"] == 2
    # Data order: group k is always row k of the seeded order, before and after the kill.
    order = DataOrder(size=ROWS, seed=0).next_batch(60)
    started = [i for r in records for i in r["data/started"]]
    assert started == order[: len(started)]
    for r in records:
        assert r["data/batch"] == [order[seq] for seq in r["async/groups"]]
    # Every group started is trained once, dropped (counted) or pending at the end.
    trained = [seq for r in records for seq in r["async/groups"]]
    dropped = [seq for r in records for seq in r["async/dropped_groups"]]
    final = latest_checkpoint(tmp_path / "run")
    assert final is not None and final.step == 5
    left = [seq for seq, _ in final.state["async"]["pending"]]
    everything = trained + dropped + left
    assert sorted(everything) == list(range(final.state["async"]["next_seq"]))
    assert {seq for seq, _ in pending} <= set(trained + dropped)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.mode=eager", "trainer.mode='eager'; use sync or async"),
        ("trainer.max_staleness=-1", "max_staleness=-1 must be an integer >= 0"),
        ("trainer.max_rollouts_in_flight=3", "at least trainer.group_size=4"),
        ("algorithm.tis_cap=0.5", "tis_cap=0.5 must be 0"),
    ],
)
def test_bad_async_settings_are_refused_before_any_rollout(tmp_path: Path, override: str, message: str) -> None:
    cfg, plugins = _cfg(tmp_path, override)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Trainer(cfg, plugins)


def test_sync_run_refuses_an_async_checkpoint_with_groups_in_flight(tmp_path: Path) -> None:
    run = tmp_path / "run" / "checkpoints" / "step_000002"
    (run / "backend").mkdir(parents=True)
    (run / "backend" / "fake.json").write_text(json.dumps({"version": 2, "optim_steps": 2}))
    state = {
        "step": 2,
        "data": DataOrder(size=ROWS, seed=0).state(),
        "backend_path": str(run / "backend"),
        "async": {"next_seq": 6, "pending": [[4, 1], [5, 2]]},
    }
    (run / "trainer_state.json").write_text(json.dumps(state))
    cfg, plugins = _cfg(tmp_path, "trainer.resume=true", "trainer.canary=false")
    with pytest.raises(ConfigError, match="resume it with trainer.mode=async"):
        asyncio.run(Trainer(cfg, plugins).run())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.mode=async", "backend 'verl' runs its own trainer. Use its own asynchronous switch"),
        ("algorithm.tis_cap=2", "Use its own truncated importance sampling setting"),
    ],
)
def test_backends_with_their_own_trainer_refuse_core_async_settings(
    tmp_path: Path, override: str, message: str
) -> None:
    from core.train import check_driving_settings

    cfg, _ = _cfg(tmp_path, override)
    with pytest.raises(ConfigError, match=message):
        check_driving_settings(cfg, "verl")
    cfg, _ = _cfg(tmp_path)
    check_driving_settings(cfg, "verl")  # the defaults pass


@pytest.mark.integration
def test_local_backend_trains_async_with_a_truncated_importance_weight(tmp_path: Path) -> None:
    """The real local backend (tiny model, CPU): weights published while rollouts are in
    flight, every turn stamped with the version that generated it, the loss truncated."""
    from core.plugins import load_plugins
    from core.testing.fakes import compose

    plugins = load_plugins()
    cfg = compose(
        [
            f"run_dir={tmp_path / 'run'}",
            "trainer.max_steps=4",
            "trainer.batch_size=2",
            "trainer.group_size=4",
            "trainer.eval_every=0",
            "trainer.save_every=0",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            "trainer.mode=async",
            "trainer.max_staleness=1",
            "algorithm.tis_cap=2.0",
            "runtime.num_processes=1",
            "task.generator_kwargs.rows=40",
        ],
        plugins,
    )
    run = Trainer(cfg, plugins)
    assert asyncio.run(run.run()) == 0
    records = _steps(run)
    assert len(records) == 4
    trained = [r for r in records if r["train/skipped"] == 0.0]
    assert trained and all(0.0 <= r["train/tis_truncated_fraction"] <= 1.0 for r in trained)
    assert max(r["async/staleness_max"] for r in records) <= 1
    assert records[-1]["weight_version"] == len(trained)

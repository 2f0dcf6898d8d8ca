"""The training loop's mechanics with a recording fake backend (no torch): real
gateway, real local runtime with agent processes, real HTTP. Learning itself is
tested in test_learning.py with the local torch backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import RunAborted
from core.plugins import load_plugins
from core.testing.fakes import CREATED, compose, fake_backend_plugin
from core.trainer.loop import Trainer
from core.trainer.metrics import read_metrics

HERE = Path(__file__).parent

REQUIRED_KEYS = {
    "step",
    "reward/mean",
    "reward/std",
    "rollouts/ok",
    "rollouts/failed",
    "rollouts/timeout",
    "rollouts/crashed",
    "tokens/trained",
    "turns/total",
    "trace/forks",
    "trace/ill_formed_tool_calls",
    "train/logprob_diff_max",
    "time/rollout",
    "time/train",
    "time/weight_sync",
    "time/loop_overhead_frac",
}


def _cfg(tmp_path: Path, *extra: str, agent: str = "core.tasks.succ_digit:app") -> Any:
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    cfg = compose(
        [
            "backend=fake",
            f"run_dir={tmp_path / 'run'}",
            "trainer.max_steps=3",
            "trainer.batch_size=2",
            "trainer.group_size=4",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            "runtime.num_processes=1",
            f"task.agent={agent}",
            f"+task.agent_env.PYTHONPATH={HERE}",
            "task.generator_kwargs.rows=40",
            *extra,
        ],
        plugins,
    )
    return cfg, plugins


def _train(cfg: Any, plugins: Any) -> Trainer:
    trainer = Trainer(cfg, plugins)
    code = asyncio.run(trainer.run())
    assert code == 0
    return trainer


@pytest.mark.integration
def test_loop_trains_logs_and_closes(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path)
    CREATED.clear()
    trainer = _train(cfg, plugins)
    backend = CREATED[-1]
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert REQUIRED_KEYS <= set(r), REQUIRED_KEYS - set(r)
        assert r["rollouts/ok"] == 8 and r["rollouts/failed"] == 0
        assert r["turns/total"] == 8
    # every step that had a learning signal trained, synced and bumped the version
    trained_steps = len(backend.datums_seen)
    assert backend.optim_steps == trained_steps == backend.version >= 1
    for datums in backend.datums_seen:
        for d in datums:
            # one generated digit + EOS, trained with the advantage of its rollout
            assert sum(d.weights) == 2
            assert len({a for a, w in zip(d.advantages, d.weights, strict=True) if w}) == 1
    assert backend.closed
    assert (trainer.run_dir / "report.html").read_text().count("<polyline") >= 1
    assert (trainer.run_dir / "checkpoints" / "step_000003" / "trainer_state.json").exists()


@pytest.mark.integration
def test_resume_continues_step_count_and_data_order(tmp_path: Path) -> None:
    full_cfg, plugins = _cfg(tmp_path / "full", "trainer.max_steps=4")
    full = _train(full_cfg, plugins)
    full_records = [r for r in read_metrics(full.run_dir / "metrics.jsonl") if "data/cursor" in r]

    cfg, plugins = _cfg(tmp_path / "split", "trainer.max_steps=2")
    _train(cfg, plugins)
    resumed_cfg, plugins = _cfg(tmp_path / "split", "trainer.max_steps=4", "trainer.resume=true")
    resumed = _train(resumed_cfg, plugins)
    assert resumed.step == 4
    records = [r for r in read_metrics(resumed.run_dir / "metrics.jsonl") if "data/cursor" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["data/batch"] for r in records] == [r["data/batch"] for r in full_records]


def _write_flaky_data(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"n": n % 10, "answer": str((n + 1) % 10), "fail": n % 2 == 1} for n in range(20)]
    path.write_text("".join(json.dumps({"payload": r}) + "\n" for r in rows))


@pytest.mark.integration
def test_failure_rate_above_threshold_aborts_with_counts(tmp_path: Path) -> None:
    data = tmp_path / "flaky.jsonl"
    _write_flaky_data(data)
    cfg, plugins = _cfg(
        tmp_path,
        f"task.train_path={data}",
        "trainer.max_failure_rate=0.2",
        "trainer.batch_size=4",
        agent="loop_agents:flaky",
    )
    with pytest.raises(RunAborted, match=r"(?s)rollouts failed.*'crashed'") as info:
        asyncio.run(Trainer(cfg, plugins).run())
    assert "agent crashed on purpose" in str(info.value)


@pytest.mark.integration
def test_single_failures_below_threshold_do_not_stop_the_run(tmp_path: Path) -> None:
    data = tmp_path / "flaky.jsonl"
    _write_flaky_data(data)
    cfg, plugins = _cfg(
        tmp_path, f"task.train_path={data}", "trainer.max_failure_rate=0.9", agent="loop_agents:flaky"
    )
    trainer = _train(cfg, plugins)
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert sum(r["rollouts/crashed"] for r in records) > 0
    assert all(r["rollouts/excluded_failed"] == r["rollouts/failed"] for r in records)


@pytest.mark.integration
def test_canary_catches_agent_that_never_calls_the_gateway(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, agent="loop_agents:silent")
    with pytest.raises(RunAborted, match="made no model call through the gateway"):
        asyncio.run(Trainer(cfg, plugins).run())


@pytest.mark.integration
def test_canary_reports_a_crashing_agent(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, agent="loop_agents:crashing")
    with pytest.raises(RunAborted, match=r"(?s)canary rollout failed with status 'crashed'.*connection refused"):
        asyncio.run(Trainer(cfg, plugins).run())

"""The training loop's mechanics with a recording fake backend (no torch): real
gateway, real local runtime with agent processes, real HTTP. Learning itself is
tested in test_learning.py with the local torch backend."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, RunAborted
from core.plugins import load_plugins
from core.rollout import RolloutOutcome
from core.rundir.checkpoint import RunDirLock
from core.rundir.metrics import read_metrics
from core.rundir.traces import list_traces
from core.testing.fakes import CREATED, compose, fake_backend_plugin
from core.testing.parity import expected_token_advantages
from core.trainer.loop import Trainer
from core.types import Datum

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
    "gateway/tool_parse_failed",
    "gateway/turns_with_tools",
    "gateway/parse/no_tools",
    "gateway/parse/calls",
    "train/logprob_diff_max",
    "time/rollout",
    "time/train",
    "time/weight_sync",
    "time/loop_overhead_frac",
    "train/skipped",
    "rollouts/sampler_error",
    "rollouts/no_model_calls",
    "faults/sampler_errors",
    "faults/in_flight_at_finish",
    "faults/aborted_turns",
    "faults/disconnected_turns",
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
    cfg, plugins = _cfg(tmp_path, "trainer.keep_traces=2")
    CREATED.clear()
    trainer = _train(cfg, plugins)
    backend = CREATED[-1]
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert REQUIRED_KEYS <= set(r), REQUIRED_KEYS - set(r)
        assert r["rollouts/ok"] == 8 and r["rollouts/failed"] == 0
        assert r["turns/total"] == 8
        # succ_digit offers no tools: every turn is ``no_tools``, and no rate to warn about.
        assert r["gateway/parse/no_tools"] == 8 and r["gateway/turns_with_tools"] == 0
        assert r["gateway/tool_parse_failed"] == 0.0
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
    assert list_traces(trainer.run_dir)["train"] == [2, 3]  # trainer.keep_traces=2: step 1's removed


@pytest.mark.integration
def test_tools_offered_and_never_called_warn_once_and_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every request offers a tool and the fake model only ever answers a digit: each step
    counts its turns as ``text`` among the turns with tools, and the console warns on the
    first step only (not on every step while nothing changes)."""
    cfg, plugins = _cfg(tmp_path, agent="loop_agents:tooled")
    trainer = _train(cfg, plugins)
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["gateway/turns_with_tools"] == r["gateway/parse/text"] == 8
        assert r["gateway/parse/calls"] == r["gateway/parse/no_tools"] == 0
        assert r["gateway/tool_parse_failed"] == 0.0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "no turn called one" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: step 1: tools were offered in 8 turns"), err
    assert "gateway.tool_parser" in warned[0]


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


# -- the advantages forward_backward receives (#14 D) -----------------------------------


def _spy_on_rollouts(monkeypatch: pytest.MonkeyPatch) -> list[list[RolloutOutcome]]:
    """Record each step's outcomes as the loop got them from the runner (read-only spy)."""
    seen: list[list[RolloutOutcome]] = []
    original = Trainer._rollouts

    async def spy(self: Trainer) -> list[RolloutOutcome]:
        outcomes = await original(self)
        seen.append(outcomes)
        return outcomes

    monkeypatch.setattr(Trainer, "_rollouts", spy)
    return seen


def _assert_backend_got_the_specified_advantages(
    steps: list[list[RolloutOutcome]], sent: list[list[Datum]]
) -> int:
    """Each step's datums, as the fake backend received them, carry the advantages
    ``core.testing.parity`` specifies for that step's outcomes (shifted by one);
    steps without signal send nothing. Returns how many non-zero advantages were seen."""
    expected_steps = []
    for outcomes in steps:
        spec = expected_token_advantages(outcomes)  # type: ignore[arg-type]
        rows = [
            spec[(o.request.rollout_id, row.row_index)][1:]
            for o in outcomes
            for row in o.rows
            if (o.request.rollout_id, row.row_index) in spec
        ]
        if any(a != 0.0 for adv in rows for a in adv):
            expected_steps.append(rows)
    assert len(sent) == len(expected_steps), "steps with signal and forward_backward calls differ"
    nonzero = 0
    for datums, want in zip(sent, expected_steps, strict=True):
        got = [list(d.advantages) for d in datums]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g == pytest.approx(w, abs=1e-9)
            nonzero += sum(1 for a in g if a != 0.0)
    return nonzero


def _signal_cfg(tmp_path: Path) -> tuple[Any, Any]:
    # 4 groups of 8 over 2 steps: the chance that no group has a correct digit is ~1e-3
    return _cfg(tmp_path, "trainer.max_steps=2", "trainer.batch_size=4", "trainer.group_size=8",
                "trainer.eval_every=0", "task.eval_path=''")


@pytest.mark.integration
def test_forward_backward_gets_the_specified_advantages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _spy_on_rollouts(monkeypatch)
    cfg, plugins = _signal_cfg(tmp_path)
    CREATED.clear()
    _train(cfg, plugins)
    backend = CREATED[-1]
    nonzero = _assert_backend_got_the_specified_advantages(steps, backend.datums_seen)
    assert nonzero > 0  # the run had signal, so a zeroing bug could not hide
    # signs: a correct reply (reward 1) is pushed up, a wrong one down
    for datums in backend.datums_seen:
        for d in datums:
            trained = {a for a, w in zip(d.advantages, d.weights, strict=True) if w}
            assert len(trained) == 1


def _negate(stats: Any) -> Any:
    stats.advantages = {k: -v for k, v in stats.advantages.items()}
    return stats


def _zero(stats: Any) -> Any:
    stats.advantages = {k: 0.0 for k in stats.advantages}
    return stats


@pytest.mark.integration
@pytest.mark.parametrize(
    ("where", "sabotage"),
    [("advantages", _negate), ("advantages", _zero), ("datum", "negate")],
    ids=["negated-advantages", "zeroed-advantages", "negated-datum"],
)
def test_the_advantage_check_catches_a_sabotaged_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, sabotage: Any
) -> None:
    """Proof that the test above fails when the loop zeroes or flips the advantages."""
    import core.trainer.signal as signal_module

    if where == "advantages":
        original = signal_module.compute_group_advantages
        monkeypatch.setattr(signal_module, "compute_group_advantages", lambda *a, **k: sabotage(original(*a, **k)))
    else:
        to_datum = signal_module.trace_to_datum
        monkeypatch.setattr(signal_module, "trace_to_datum", lambda row, adv: to_datum(row, -adv))
    steps = _spy_on_rollouts(monkeypatch)
    cfg, plugins = _signal_cfg(tmp_path)
    CREATED.clear()
    _train(cfg, plugins)
    with pytest.raises(AssertionError):
        _assert_backend_got_the_specified_advantages(steps, CREATED[-1].datums_seen)


# -- steps without signal, loss config, broken rollouts (#14 E, #14.6, #15.10) ------------


@pytest.mark.integration
def test_a_step_without_signal_skips_the_update(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, "trainer.max_steps=2", agent="loop_agents:constant")
    CREATED.clear()
    trainer = _train(cfg, plugins)
    backend = CREATED[-1]
    assert backend.datums_seen == [] and backend.optim_steps == 0 and backend.version == 0
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["train/skipped"] for r in records] == [1.0, 1.0]
    assert all(r["groups/skipped_constant"] == 2 and r["weight_version"] == 0 for r in records)


@pytest.mark.integration
@pytest.mark.parametrize(
    "override", ["+algorithm.loss_config.entropy_coef=0.01", "algorithm.loss=cross_entropy"]
)
def test_a_loss_that_needs_no_advantage_still_trains_a_step_without_them(
    tmp_path: Path, override: str
) -> None:
    """An entropy bonus is a gradient of its own; cross_entropy (supervised) ignores advantages."""
    cfg, plugins = _cfg(tmp_path, "trainer.max_steps=1", override, agent="loop_agents:constant")
    CREATED.clear()
    trainer = _train(cfg, plugins)
    backend = CREATED[-1]
    assert backend.optim_steps == 1 and len(backend.datums_seen) == 1
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert records[0]["train/skipped"] == 0.0


@pytest.mark.integration
def test_turns_sampled_with_an_override_are_context_not_trained(tmp_path: Path) -> None:
    """An agent allowed to override sampling asks for temperature 0.5 on odd rows while the
    loss scores at 1.0: those turns get loss weight 0 and are counted, never trained as if
    on-policy; their rollouts still count in their groups."""
    cfg, plugins = _cfg(
        tmp_path, "trainer.max_steps=3", "gateway.allow_sampling_overrides=true",
        "trainer.eval_every=0", "task.eval_path=''", agent="loop_agents:overriding",
    )
    CREATED.clear()
    trainer = _train(cfg, plugins)
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert sum(r["turns/masked_overrides"] for r in records) > 0
    for r in records:
        assert r["tokens/masked_overrides"] == 2 * r["turns/masked_overrides"]  # a digit + EOS each
        assert r["rollouts/ok"] == 8 and r["turns/total"] == 8
    trained_records = [r for r in records if r["train/skipped"] == 0.0]
    assert len(trained_records) == len(CREATED[-1].datums_seen)
    for r, datums in zip(trained_records, CREATED[-1].datums_seen, strict=True):
        # one row per rollout; an overridden row has nothing left to train and sends no datum
        assert len(datums) == 8 - r["turns/masked_overrides"]


def test_importance_sampling_with_ppo_clip_settings_fails_at_config_time(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, "algorithm.loss=importance_sampling")
    Trainer(cfg, plugins)  # the default loss_config suits every loss
    cfg, plugins = _cfg(
        tmp_path, "algorithm.loss=importance_sampling",
        "+algorithm.loss_config.clip_low=0.2", "+algorithm.loss_config.clip_high=0.2",
    )
    with pytest.raises(ConfigError, match="loss=importance_sampling clips nothing") as info:
        Trainer(cfg, plugins)
    fix = str(info.value).split("drop them with '")[1].split("'")[0].split()
    assert fix == ["~algorithm.loss_config.clip_high", "~algorithm.loss_config.clip_low"]
    cfg, plugins = _cfg(tmp_path, "algorithm.std=unbiased")
    with pytest.raises(ConfigError, match="algorithm.std='unbiased'"):
        Trainer(cfg, plugins)
    cfg, plugins = _cfg(tmp_path, "trainer.exclude_on=[sampler_errors]")
    with pytest.raises(ConfigError, match="exclude_on"):
        Trainer(cfg, plugins)


@pytest.mark.integration
def test_rollouts_that_swallowed_a_sampler_error_are_excluded_and_counted(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, "backend.fail_every=5", "trainer.canary=false",
                        "trainer.max_failure_rate=0.9", agent="loop_agents:swallowing")
    CREATED.clear()
    trainer = _train(cfg, plugins)
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert sum(r["rollouts/sampler_error"] for r in records) > 0
    for r in records:
        assert r["rollouts/sampler_error"] == r["faults/sampler_errors"]  # one failed call each
        assert r["rollouts/excluded_failed"] == r["rollouts/failed"] == r["rollouts/sampler_error"]
        assert r["rollouts/ok"] + r["rollouts/sampler_error"] == 8
    trained = sum(len(d) for d in CREATED[-1].datums_seen)
    assert trained <= sum(r["rollouts/ok"] for r in records)  # only ok rollouts reach the backend


@pytest.mark.integration
def test_huge_rewards_become_invalid_reward_rollouts(tmp_path: Path) -> None:
    data = tmp_path / "huge.jsonl"
    kinds = ["float", "int", None, None]
    rows = [{"n": n % 10, "answer": str((n + 1) % 10), "huge": kinds[n % 4]} for n in range(20)]
    data.write_text("".join(json.dumps({"payload": r}) + "\n" for r in rows))
    cfg, plugins = _cfg(tmp_path, f"task.train_path={data}", "trainer.batch_size=4", "trainer.canary=false",
                        "trainer.max_failure_rate=0.9", agent="loop_agents:huge")
    trainer = _train(cfg, plugins)
    records = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        huge_rows = sum(1 for i in r["data/batch"] if rows[i]["huge"])
        assert r["rollouts/invalid_reward"] == 4 * huge_rows  # group_size 4
        assert r["rollouts/ok"] == 16 - 4 * huge_rows
    assert sum(r["rollouts/invalid_reward"] for r in records) > 0
    assert all(r["reward/mean"] is None or r["reward/mean"] <= 1.0 for r in records)


# -- run directories (#15.11) ---------------------------------------------------------------


def test_a_fresh_run_over_an_old_runs_checkpoints_is_refused(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path)
    old = Path(str(cfg.run_dir)) / "checkpoints" / "step_000050"
    old.mkdir(parents=True)
    (old / "trainer_state.json").write_text(json.dumps({"step": 50, "data": {}, "backend_path": "x"}))
    CREATED.clear()
    with pytest.raises(ConfigError, match=r"already holds checkpoints \(step_000050.*trainer.resume=true"):
        asyncio.run(Trainer(cfg, plugins).run())
    assert CREATED == []  # refused before building the backend


def test_a_fresh_run_over_an_old_runs_metrics_is_refused(tmp_path: Path) -> None:
    """A run that crashed before its first checkpoint left metrics: a fresh run there
    would append to them and the report would mix the two runs."""
    cfg, plugins = _cfg(tmp_path)
    run_dir = Path(str(cfg.run_dir))
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    CREATED.clear()
    with pytest.raises(ConfigError, match="already holds metrics.jsonl of an earlier run"):
        asyncio.run(Trainer(cfg, plugins).run())
    assert CREATED == []


def test_a_second_run_into_a_run_dir_in_use_is_refused(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path)
    run_dir = Path(str(cfg.run_dir))
    run_dir.mkdir(parents=True)
    holder = RunDirLock(run_dir)
    try:
        with pytest.raises(ConfigError, match="is in use by another training run"):
            asyncio.run(Trainer(cfg, plugins).run())
    finally:
        holder.release()


def test_default_run_dirs_of_runs_started_together_differ() -> None:
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    dirs = [str(compose(["backend=fake"], plugins).run_dir) for _ in range(3)]
    assert len(set(dirs)) == 3, dirs
    assert all(re.fullmatch(r"outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}", d) for d in dirs), dirs


@pytest.mark.integration
def test_steps_replayed_after_a_crash_are_logged_once(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, "trainer.max_steps=4", "trainer.save_every=2")
    first = _train(cfg, plugins)
    # a crash after step 4 was logged but before its checkpoint landed
    shutil.rmtree(first.run_dir / "checkpoints" / "step_000004")
    cfg, plugins = _cfg(tmp_path, "trainer.max_steps=4", "trainer.save_every=2", "trainer.resume=true")
    resumed = _train(cfg, plugins)
    assert resumed.step == 4
    raw = [json.loads(line) for line in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in raw if "reward/mean" in r] == [1, 2, 3, 4, 3, 4]  # 3 and 4 replayed
    records = [r for r in read_metrics(resumed.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4]


@pytest.mark.integration
@pytest.mark.parametrize("keep_best", [True, False])
def test_checkpoint_retention_keeps_the_last_k_and_the_best_by_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_best: bool
) -> None:
    scores = {0: 0.5, 1: 0.2, 2: 0.9, 3: 0.1, 4: 0.3, 5: 0.2}  # step 2 is the best evaluated step

    async def scripted_eval(self: Trainer) -> dict[str, float]:
        return {"eval/reward_mean": scores[self.step]}

    monkeypatch.setattr(Trainer, "evaluate", scripted_eval)
    cfg, plugins = _cfg(tmp_path, "trainer.max_steps=5", "trainer.save_every=1", "trainer.eval_every=1",
                        "trainer.keep_checkpoints=2", f"trainer.keep_best_checkpoint={str(keep_best).lower()}")
    trainer = _train(cfg, plugins)
    kept = sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir())
    assert kept == (["step_000002"] if keep_best else []) + ["step_000004", "step_000005"]


def test_keep_checkpoints_must_not_be_negative(tmp_path: Path) -> None:
    cfg, plugins = _cfg(tmp_path, "trainer.keep_checkpoints=-1")
    with pytest.raises(ConfigError, match=r"trainer.keep_checkpoints=-1 must be 0 \(keep all\)"):
        Trainer(cfg, plugins)

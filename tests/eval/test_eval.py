"""``core.eval``: pass@k maths, compare, and evaluations against a checkpoint of a tiny
run (fake backend, real gateway and agent processes) and against an OpenAI-compatible
endpoint (the real ``python -m core.eval`` command; the endpoint is scripted)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI

from core.errors import ConfigError
from core.eval import EvalRow, compare_rows, k_values, pass_at_k, read_rows, summarize, write_rows
from core.eval.cli import evaluate_config
from core.eval.compare import compare_main
from core.eval.run import EndpointRunner
from core.plugins import load_plugins
from core.rundir.metrics import read_metrics
from core.testing.fakes import compose, fake_backend_plugin
from core.trainer.loop import Trainer
from core.types import RolloutRequest, RolloutResult, RolloutStatus, SamplingParams
from core.view.data import RunData

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _row(prompt: int, sample: int, reward: float | None, status: str = "ok", key: str = "") -> EvalRow:
    return EvalRow(prompt=prompt, sample=sample, payload_key=key or f"p{prompt}", status=status, reward=reward)


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer failures than draws
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)
    assert k_values(8) == [1, 2, 4, 8] and k_values(3) == [1, 2, 3] and k_values(1) == [1]


def test_summary_counts_pass_mean_and_failures() -> None:
    rows = [
        _row(0, 0, 1.0), _row(0, 1, 1.0), _row(0, 2, 0.0), _row(0, 3, 1.0),  # 3 of 4 pass
        _row(1, 0, 0.5), _row(1, 1, None, "crashed"), _row(1, 2, 0.0), _row(1, 3, None, "judge_error"),
    ]
    s = summarize(rows)
    assert s["prompts"] == 2 and s["rollouts"] == 8 and s["samples_per_prompt"] == 4
    assert s["failed"] == 2 and s["statuses"] == {"crashed": 1, "judge_error": 1, "ok": 6}
    assert s["reward_mean"] == pytest.approx(3.5 / 6)  # ok rollouts only
    assert s["mean@4"] == pytest.approx((3 / 4 + 0.5 / 4) / 2)  # failures count as 0
    assert s["pass@1"] == pytest.approx((3 / 4 + 0) / 2)
    assert s["pass@2"] == pytest.approx((1.0 + 0) / 2)  # 1 - C(1,2)/C(4,2) = 1
    assert s["pass@4"] == pytest.approx(0.5)
    assert summarize(rows, pass_threshold=0.5)["pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)


def test_summary_component_means_leave_failed_rollouts_out() -> None:
    """A failed rollout that still carries a component (the agent's own ``reward/format``
    metric of a rollout later excluded as ``sampler_error``) is counted in ``failed``,
    not averaged into ``reward/format``: it was, while ``reward_mean`` left it out."""
    rows = [_row(0, 0, 1.0), _row(0, 1, 0.0), _row(0, 2, None, "sampler_error")]
    rows[0].components, rows[1].components = {"format": 1.0}, {"format": 0.5, "judge": 0.25}
    rows[2].components = {"format": 0.0, "judge": 1.0}
    s = summarize(rows)
    assert s["reward/format"] == pytest.approx(0.75) and s["reward/judge"] == pytest.approx(0.25)
    assert s["failed"] == 1 and s["reward_mean"] == pytest.approx(0.5)
    assert not any(k.startswith("reward/") for k in summarize(rows[2:]))  # no ok rollout: no mean


def test_compare_prints_per_prompt_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = [_row(0, 0, 0.0), _row(0, 1, 0.0), _row(1, 0, 1.0), _row(1, 1, 1.0), _row(2, 0, 1.0), _row(2, 1, 0.0)]
    b = [_row(0, 0, 1.0), _row(0, 1, 1.0), _row(1, 0, 1.0), _row(1, 1, None, "crashed"), _row(2, 0, 1.0), _row(2, 1, 0.0)]
    write_rows(tmp_path / "a.jsonl", a)
    write_rows(tmp_path / "b.jsonl", b)
    assert read_rows(tmp_path / "a.jsonl") == a
    assert compare_main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["0", "0.0000", "1.0000", "+1.0000", "0/2", "->", "2/2"]
    assert out[2].split() == ["1", "1.0000", "0.5000", "-0.5000", "2/2", "->", "1/2"]
    assert not any(line.split()[:1] == ["2"] for line in out[1:3])  # unchanged prompt 2 not listed
    assert "3 prompts in both: 1 better, 1 worse, 1 unchanged" in "\n".join(out)
    assert "failed: 0.0000 -> 1.0000 (+1.0000)" in out
    with pytest.raises(ConfigError, match="prompt 1 .*different payload"):
        compare_rows(a, [_row(1, 0, 1.0, key="other")])


def _cfg(tmp_path: Path, *extra: str) -> tuple[Any, Any]:
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    cfg = compose(
        [
            "backend=fake",
            f"run_dir={tmp_path / 'run'}",
            "trainer.max_steps=2",
            "trainer.batch_size=2",
            "trainer.group_size=4",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            "trainer.eval_every=1",
            "runtime.num_processes=1",
            "task.generator_kwargs.rows=40",
            *extra,
        ],
        plugins,
    )
    return cfg, plugins


@pytest.mark.integration
def test_eval_of_a_checkpoint_serves_its_weights(tmp_path: Path) -> None:
    """Train the fake backend two steps, then evaluate its checkpoint and the base model:
    every evaluated token comes from the checkpoint's weight version (the base: 0)."""
    cfg, plugins = _cfg(tmp_path)
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    run = tmp_path / "run"
    saved = json.loads((run / "checkpoints" / "step_000002" / "backend" / "fake.json").read_text())["version"]
    assert saved >= 1
    # The loop's periodic eval went through core.eval (same metric names as before, plus pass@1).
    evals = [r for r in read_metrics(run / "metrics.jsonl") if "eval/reward_mean" in r]
    assert [r["step"] for r in evals] == [0, 1, 2] and all(r["eval/failed"] == 0 for r in evals)
    assert all(0.0 <= r["eval/pass@1"] <= 1.0 for r in evals)

    for name, checkpoint, version in (("ckpt", str(run), saved), ("base", "", 0)):
        out = tmp_path / name
        ecfg, _ = _cfg(
            tmp_path,
            f"eval.checkpoint={checkpoint}",
            f"eval.output_dir={out}",
            "eval.samples_per_prompt=3",
            "eval.temperature=1.0",
            "eval.limit=4",
            "eval.progress=false",
        )
        summary = asyncio.run(evaluate_config(ecfg, plugins))
        rows = read_rows(out / "results.jsonl")
        assert [(r.prompt, r.sample) for r in rows] == [(p, s) for p in range(4) for s in range(3)]
        assert {r.weight_version for r in rows} == {version}, name
        assert all(r.ok and r.generated_tokens == 2 and r.prompt_tokens > 0 for r in rows)
        written = json.loads((out / "summary.json").read_text())
        assert written["rollouts"] == 12 and written["pass@3"] >= written["pass@1"]
        assert written["generated_tokens"] == 24 == summary["generated_tokens"]
        # The rollouts are stored for the viewer like the loop's evaluations.
        stored = RunData(out).step("eval", 0)
        assert len(stored["rollouts"]) == 12, stored.keys()
        # Certified on start as training is; each turn's parse status reported (no tools offered).
        assert json.loads((out / "template_certificate.json").read_text())["verdict"] == "holds"
        assert written["gateway/parse/no_tools"] == 12 and written["gateway/turns_with_tools"] == 0
        assert written["gateway/tool_parse_failed"] == 0.0


@pytest.mark.integration
def test_eval_refuses_an_uncertified_template_and_runs_with_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m core.eval`` through the gateway certifies the model's template first, as training
    does: the fake backend's tiny tokenizer with the whitespace-broken template of
    tests/gateway/test_certify.py is refused naming the case and the override, and evaluated with it."""
    import core.tokenizer
    from tests.gateway.test_certify import whitespace_template

    built = core.tokenizer.build_tiny_tokenizer

    def broken(**kw: Any) -> Any:
        tok = built(**kw)
        tok.chat_template = whitespace_template()
        return tok

    monkeypatch.setattr(core.tokenizer, "build_tiny_tokenizer", broken)
    monkeypatch.setenv("TRACERL_CACHE_DIR", str(tmp_path / "cache"))
    common = ["eval.limit=2", "eval.samples_per_prompt=1", "eval.progress=false"]
    ecfg, plugins = _cfg(tmp_path, f"eval.output_dir={tmp_path / 'refused'}", *common)
    with pytest.raises(ConfigError, match="chat template does not certify: case 'plain'") as refused:
        asyncio.run(evaluate_config(ecfg, plugins))
    assert "gateway.allow_uncertified_template=true" in str(refused.value)
    assert not (tmp_path / "refused" / "results.jsonl").exists()
    ecfg, plugins = _cfg(tmp_path, f"eval.output_dir={tmp_path / 'allowed'}", *common,
                         "gateway.allow_uncertified_template=true")
    summary = asyncio.run(evaluate_config(ecfg, plugins))
    assert summary["rollouts"] == 2
    assert "warning: training with an uncertified chat template" in capsys.readouterr().err
    assert json.loads((tmp_path / "allowed" / "template_certificate.json").read_text())["verdict"] == "fails"


def _digit_endpoint(body: dict[str, Any]) -> str:
    """Right for even n, wrong for odd n (``After n?`` is the last message)."""
    n = int(body["messages"][-1]["content"].removeprefix("After ").removesuffix("?"))
    return str((n + 1) % 10) if n % 2 == 0 else "x"


@pytest.mark.integration
def test_cli_evaluates_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    """``python -m core.eval eval.endpoint=...``: the agent calls the endpoint itself
    (its model name, key and sampling settings), results and summary are written."""
    with ScriptedOpenAI(_digit_endpoint) as server:
        env = {**os.environ, "MY_KEY": "sk-test", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [
                sys.executable, "-m", "core.eval",
                f"eval.endpoint={server.base_url}", "eval.model=hosted-1", "eval.api_key_env=MY_KEY",
                "eval.samples_per_prompt=2", "eval.temperature=0.7", "eval.progress=false",
                f"run_dir={tmp_path}", "runtime.num_processes=1",
            ],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(server.requests) == 20
        assert {b["model"] for b in server.requests} == {"hosted-1"}
        assert {b["temperature"] for b in server.requests} == {0.7}
        assert set(server.auth) == {"Bearer sk-test"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["prompts"] == 10 and summary["rollouts"] == 20 and summary["failed"] == 0
    assert summary["reward_mean"] == 0.5 and summary["pass@1"] == 0.5 and summary["pass@2"] == 0.5
    assert summary["generated_tokens"] == 0  # no gateway, no trace capture
    rows = read_rows(tmp_path / "results.jsonl")
    assert {r.prompt: r.reward for r in rows} == {p: (1.0 if p % 2 == 0 else 0.0) for p in range(10)}
    assert "pass@2" in proc.stdout and "reward_mean" in proc.stdout
    assert math.isclose(float(proc.stdout.split("reward_mean")[1].split()[0]), 0.5)
    # Stored for the viewer as the in-process evaluation's rollouts are (it wrote none):
    # no conversation or tokens without a gateway, but status and reward per rollout.
    stored = RunData(tmp_path).step("eval", 0)["rollouts"]
    assert len(stored) == 20 and {r["status"] for r in stored} == {"ok"}
    assert sorted(r["reward"] for r in stored) == [0.0] * 10 + [1.0] * 10
    assert RunData(tmp_path).rollout("eval", 0, stored[0]["rollout_id"])["rows"] == []


def test_endpoint_rollouts_meet_the_reward_bound_of_classify() -> None:
    """``EndpointRunner`` checks a result with ``classify`` (the in-process runner's
    checks) instead of its own copy of the reward bound; with no gateway there are no
    session faults, so an ok rollout with a sane reward stays ok. The runtime is a
    stand-in returning fixed results: the runner's handling is what is tested."""

    class Fixed:
        def __init__(self) -> None:
            self.seen: list[RolloutRequest] = []

        async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
            self.seen.append(request)
            reward = 1e12 if request.payload["n"] else 0.5
            return RolloutResult(request.rollout_id, RolloutStatus.OK, reward=reward, metrics={"reward/x": 1.0})

    runtime = Fixed()
    runner = EndpointRunner(runtime=runtime, base_url="http://127.0.0.1:9/v1", model_id="m", api_key="k",
                            max_concurrency=2, timeout_s=5.0, max_abs_reward=10.0)
    out = asyncio.run(runner.run_groups([("g0", {"n": 0}), ("g1", {"n": 1})], group_size=2,
                                        sampling=SamplingParams(max_tokens=4, seed=3)))
    assert [o.result.status for o in out] == [RolloutStatus.OK] * 2 + [RolloutStatus.INVALID_REWARD] * 2
    assert out[0].result.reward == 0.5 and out[2].result.reward is None
    assert "larger in magnitude than trainer.max_abs_reward=10.0; rescale the reward" in str(out[2].result.error)
    # Seeded like RolloutRunner.run_groups: rollout i gets seed + 7919 i, in order.
    assert [r.sampling_params["seed"] for r in runtime.seen] == [3 + 7_919 * i for i in range(4)]


def test_summary_reports_each_policy_and_role_when_several_are_configured() -> None:
    """Rows with turns of two policies get ``policy/<name>/*`` (the role reward where the agent
    returned one, else the rollout's); role rewards get ``role/<name>/reward``; failed rollouts
    count in neither. One policy and no role rewards: no such keys."""
    rows = [_row(0, 0, 0.5), _row(0, 1, 1.0), _row(1, 0, 0.0), _row(1, 1, None, "crashed")]
    rows[0].policies, rows[0].role_rewards = {"up": 1, "down": 1}, {"up": 1.0, "down": 0.0}
    rows[1].policies, rows[1].role_rewards = {"up": 2, "down": 1}, {"up": 1.0}  # down: the rollout's reward
    rows[2].policies = {"up": 1}
    rows[3].policies, rows[3].role_rewards = {"up": 1, "down": 1}, {"up": 1.0, "down": 1.0}
    s = summarize(rows)
    assert s["policy/up/reward"] == pytest.approx((1.0 + 1.0 + 0.0) / 3)
    assert s["policy/down/reward"] == pytest.approx((0.0 + 1.0) / 2)
    assert (s["policy/up/rollouts"], s["policy/up/turns"]) == (3.0, 4.0)
    assert (s["policy/down/rollouts"], s["policy/down/turns"]) == (2.0, 2.0)
    assert s["role/up/reward"] == 1.0 and s["role/down/reward"] == 0.0
    one = [_row(0, 0, 1.0)]
    one[0].policies = {"default": 1}
    assert not any(k.startswith(("policy/", "role/")) for k in summarize(one))


@pytest.mark.integration
def test_eval_of_a_two_policy_checkpoint_loads_and_reports_each_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with a policy per role on the local backend (the two-role task), evaluated from
    its checkpoint: each policy's backend loads its own state (``backend/<policy>``), each
    turn is served by its policy, and the summary has each policy's and each role's reward;
    the loop's own evaluations report them too. Evaluating that checkpoint with one policy
    is refused, naming the policies it holds."""
    from tracerl_local.backend import LocalBackend

    plugins = load_plugins()
    two = ["+policies.up={}", "+policies.down={}"]
    base = [
        "task=two_roles", f"run_dir={tmp_path / 'run'}", "trainer.max_steps=1", "trainer.batch_size=2",
        "trainer.group_size=4", "trainer.eval_every=0", "trainer.canary=false", "trainer.progress=false",
        "trainer.loggers=[jsonl]", "runtime.num_processes=1", "task.generator_kwargs.rows=20",
        "task.generator_kwargs.digits=2",  # four eval rows: two digits, either role first
    ]
    run = tmp_path / "run"
    assert asyncio.run(Trainer(compose([*base, *two], plugins), plugins).run()) == 0
    evals = [r for r in read_metrics(run / "metrics.jsonl") if "eval/reward_mean" in r]
    assert evals and all(r["eval/policy/up/turns"] == r["eval/policy/down/turns"] > 0 for r in evals)
    assert all(0.0 <= r["eval/role/up/reward"] <= 1.0 for r in evals)

    loaded: dict[int, str] = {}
    original = LocalBackend.load_state

    async def recording(self: LocalBackend, path: str) -> None:
        loaded[id(self)] = path
        await original(self, path)

    monkeypatch.setattr(LocalBackend, "load_state", recording)
    out = tmp_path / "eval"
    settings = [f"eval.checkpoint={run}", f"eval.output_dir={out}", "eval.samples_per_prompt=3",
                "eval.temperature=1.0", "eval.progress=false"]
    summary = asyncio.run(evaluate_config(compose([*base, *two, *settings], plugins), plugins))
    step = run / "checkpoints" / "step_000001" / "backend"
    assert sorted(loaded.values()) == [str(step / "down"), str(step / "up")]  # two backends, each its own
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == 12 and all(r.ok and r.policies == {"up": 1, "down": 1} for r in rows)
    assert all(set(r.role_rewards) == {"up", "down"} for r in rows)
    for name in ("up", "down"):
        assert summary[f"policy/{name}/rollouts"] == summary[f"policy/{name}/turns"] == 12
        mean = sum(r.role_rewards[name] for r in rows) / 12
        assert summary[f"policy/{name}/reward"] == pytest.approx(mean) == summary[f"role/{name}/reward"]
    assert "policies up, down" in summary["model"]

    with pytest.raises(ConfigError, match=r"holds policies \['down', 'up'\], but this evaluation configures one"):
        asyncio.run(evaluate_config(compose([*base, *settings], plugins), plugins))


def test_eval_sessions_sample_each_policy_with_its_own_max_tokens() -> None:
    """``python -m core.eval`` with ``eval.max_tokens=0`` samples each policy's turns with its own
    ``max_tokens`` (the run's for a policy without one), as training does; a set
    ``eval.max_tokens`` is every policy's."""
    from core.eval.cli import eval_sampling
    from core.testing.build import compose_config
    from core.types import PolicySampling

    cfg = compose_config([
        "algorithm.max_tokens=8", "eval.temperature=0.5",
        "+policies.up={max_tokens:3}", "+policies.down={}", "+policies.side={max_tokens:3}",
    ])
    sampling = eval_sampling(cfg)
    assert (sampling.max_tokens, sampling.temperature) == (3, 0.5)
    assert sampling.by_policy == (("down", PolicySampling(temperature=0.5, top_p=1.0, top_k=-1, max_tokens=8)),)
    cfg.eval.max_tokens = 5
    fixed = eval_sampling(cfg)
    assert (fixed.max_tokens, fixed.by_policy) == (5, ())
    assert eval_sampling(compose_config(["algorithm.max_tokens=8"])).max_tokens == 8

"""Config translation: tracerl's composed config -> verl's command, and the dry run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tracerl_verl.data import verl_rows
from tracerl_verl.translate import LaunchPaths, verl_command, verl_env, verl_overrides
from verl_fixtures import compose_tracerl, verl_main_config

from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
PATHS = LaunchPaths(
    run_dir="/runs/r1",
    model="/m",
    train_file="/d/t.parquet",
    val_file="/d/v.parquet",
    agent_loop_yaml="/d/a.yaml",
)


def _as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def test_tracerl_settings_map_to_verl_keys() -> None:
    cfg = compose_tracerl(
        [
            "backend=verl",
            "trainer.batch_size=4",
            "trainer.group_size=8",
            "trainer.max_steps=7",
            "algorithm.learning_rate=2e-6",
            "algorithm.temperature=0.9",
            "algorithm.eval_temperature=0",
            "seed=5",
        ]
    )
    o = _as_dict(verl_overrides(cfg, PATHS))
    assert o["data.train_batch_size"] == "4"
    assert o["actor_rollout_ref.rollout.n"] == "8"
    assert o["trainer.total_training_steps"] == "7"
    assert o["actor_rollout_ref.actor.optim.lr"] == "2e-06"
    assert o["actor_rollout_ref.rollout.temperature"] == "0.9"
    assert o["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "false"
    assert o["algorithm.adv_estimator"] == "tracerl_grpo"
    assert o["+algorithm.tracerl_std"] == "population"
    assert o["+algorithm.tracerl_eps"] == "0.0001"
    assert o["data.seed"] == "5"
    assert o["trainer.v1.trainer_mode"] == "tracerl_sync"
    # one optimizer step per batch: mini-batch = the whole batch of prompts
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"
    assert o["actor_rollout_ref.rollout.agent.agent_loop_config_path"] == "/d/a.yaml"
    assert o["trainer.default_local_dir"] == "/runs/r1/verl_checkpoints"
    assert "trainer.device" not in o
    # core's empty loss_config: PPO's own 0.2/0.2, no entropy bonus, one token mean
    assert o["actor_rollout_ref.actor.clip_ratio_low"] == "0.2"
    assert o["actor_rollout_ref.actor.clip_ratio_high"] == "0.2"
    assert o["actor_rollout_ref.actor.entropy_coeff"] == "0.0"
    assert o["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"


@pytest.mark.parametrize(
    ("loss_config", "low", "high"),
    [
        ("{clip_low:0.1,clip_high:0.28,entropy_coef:0.01}", 0.1, 0.28),
        ("{clip_low_threshold:0.8,clip_high_threshold:1.3}", 0.2, 0.3),
        ("{clip_high:0.3,top_k:-1,top_p:1.0,temperature:0.7}", 0.2, 0.3),
    ],
)
def test_loss_config_reaches_verls_actor(loss_config: str, low: float, high: float) -> None:
    """The translated keys exist in verl's own config and hold core's values there."""
    cfg = compose_tracerl(
        ["backend=verl", f"++algorithm.loss_config={loss_config}", "algorithm.temperature=0.7"]
    )
    actor = verl_main_config(verl_overrides(cfg, PATHS)).actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == pytest.approx((low, high))
    assert actor.entropy_coeff == pytest.approx(0.01 if "entropy" in loss_config else 0.0)
    assert actor.loss_agg_mode == "token-mean"


def test_an_explicit_verl_loss_aggregation_replaces_the_token_mean() -> None:
    cfg = compose_tracerl(["backend=verl", "backend.loss_agg_mode=seq-mean-token-sum"])
    assert _as_dict(verl_overrides(cfg, PATHS))["actor_rollout_ref.actor.loss_agg_mode"] == (
        "seq-mean-token-sum"
    )


def test_raw_overrides_come_last_and_env_reaches_ray_workers() -> None:
    cfg = compose_tracerl(
        [
            "backend=verl",
            "backend.overrides=['actor_rollout_ref.actor.ppo_epochs=2','trainer.nnodes=4']",
            "+backend.env.MY_VAR=x",
        ]
    )
    out = verl_overrides(cfg, PATHS)
    assert out[-2:] == ["actor_rollout_ref.actor.ppo_epochs=2", "trainer.nnodes=4"]
    env_override = next(
        o for o in out if o.startswith("+ray_kwargs.ray_init.runtime_env.env_vars=")
    )
    assert (
        'MY_VAR:"x"' in env_override
        and 'VERL_USE_EXTERNAL_MODULES:"tracerl_verl.verl_ext"' in env_override
    )
    assert verl_env(cfg)["MY_VAR"] == "x"
    cmd = verl_command(cfg, PATHS)
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_passk", "gpg"])
def test_allowed_estimators_run_as_tracerl_ones_with_the_std_switch(name: str) -> None:
    cfg = compose_tracerl(["backend=verl", f"algorithm.name={name}", "algorithm.std=sample"])
    o = _as_dict(verl_overrides(cfg, PATHS))
    assert o["algorithm.adv_estimator"] == f"tracerl_{name}"
    assert o["+algorithm.tracerl_std"] == "sample"


def test_cpu_mode_adds_the_test_only_shims() -> None:
    cfg = compose_tracerl(["backend=verl", "backend.device=cpu", "backend.rollout=tracerl_cpu"])
    o = _as_dict(verl_overrides(cfg, PATHS))
    assert o["trainer.device"] == "cpu"
    assert o["+ray_kwargs.ray_init.num_gpus"] == "8"
    assert verl_env(cfg)["VERL_PLATFORM"] == "cpu"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.loss=cispo", "policy_loss.loss_mode"),
        ("algorithm.name=dpo", "use one of .*grpo"),
        ("algorithm.name=reinforce_plus_plus", "counts a rollout once"),
        ("algorithm.name=opo", "counts a rollout once"),
        ("trainer.group_size=1", "group_size >= 2"),
        ("algorithm.std=median", "algorithm.std"),
        ("backend.trainer_mode=fast", "trainer_mode"),
        ("backend.device=tpu", "backend.device"),
        ("++algorithm.loss_config={kl_coef:0.1}", r"\['kl_coef'\] have no verl equivalent"),
        ("++algorithm.loss_config={top_k:5}", "loss_config.top_k=5.0: verl's actor does not apply"),
        (
            "++algorithm.loss_config={top_p:0.9}",
            "loss_config.top_p=0.9: verl's actor does not apply",
        ),
        ("++algorithm.loss_config={temperature:0.5}", "differs from algorithm.temperature=1.0"),
        ("++algorithm.loss_config={entropy_coef:-0.1}", "entropy_coef=-0.1 must be >= 0"),
        ("++algorithm.loss_config={clip_low:1.5}", "clip_low must be in"),
        ("++algorithm.loss_config={clip_high_threshold:0.9}", "clip_high >= 0"),
        (
            "++algorithm.loss_config={clip_low:0.1,clip_low_threshold:0.8}",
            "both clip_low and clip_low_threshold",
        ),
        ("algorithm.token_mean_over=trained", "token_mean_over='trained' has no verl equivalent"),
        ("backend.loss_agg_mode=mean", "backend.loss_agg_mode='mean'"),
    ],
)
def test_untranslatable_settings_say_what_to_do(override: str, message: str) -> None:
    cfg = compose_tracerl(["backend=verl", override])
    with pytest.raises(ConfigError, match=message):
        verl_overrides(cfg, PATHS)


def test_payload_rows_carry_the_payload_and_route_to_our_loop() -> None:
    rows = verl_rows([{"n": 1, "answer": "2"}, {"q": "x"}], agent_name="tracerl_agent")
    assert [json.loads(r["tracerl_payload"]) for r in rows] == [{"n": 1, "answer": "2"}, {"q": "x"}]
    assert all(r["agent_name"] == "tracerl_agent" for r in rows)
    assert rows[1]["extra_info"] == {"index": 1}
    assert rows[0]["prompt"][0]["role"] == "user"


def test_dry_run_prints_the_exact_command_and_writes_its_inputs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "core.train",
            "backend=verl",
            "backend.dry_run=true",
            f"run_dir={run_dir}",
            "task.generator_kwargs.rows=5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verl.trainer.main_ppo" in proc.stdout
    assert f"data.train_files={run_dir}/verl/train.parquet" in proc.stdout
    table = pq.read_table(run_dir / "verl" / "train.parquet")
    assert table.num_rows == 5
    assert {"prompt", "tracerl_payload", "agent_name", "reward_model", "extra_info"} <= set(
        table.column_names
    )
    assert (run_dir / "verl" / "model" / "config.json").exists()
    assert (
        "tracerl_verl.agent_loop.TracerlAgentLoop"
        in (run_dir / "verl" / "agent_loops.yaml").read_text()
    )
    # Certified before the launch, with the tokenizer verl's workers load from the model directory.
    assert json.loads((run_dir / "template_certificate.json").read_text())["verdict"] == "holds"


def test_the_launch_refuses_an_uncertified_template_and_runs_with_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``backend=verl`` certifies the model's chat template before launching verl, as
    ``python -m core.train`` does for the backends it drives: a model directory whose tokenizer has
    the whitespace-broken template of tests/gateway/test_certify.py is refused (nothing launched,
    not even the dry run's command printed), and prepared with ``gateway.allow_uncertified_template``."""
    from tracerl_verl.backend import VerlBackend

    from core.tokenizer import CHATML_TOOLS_TEMPLATE, build_tiny_tokenizer

    # tests/gateway/test_certify.py's whitespace_template (not importable from verl's test tree):
    # one more newline after a past assistant turn's header than the generation prompt has.
    header = "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    tok = build_tiny_tokenizer()
    tok.chat_template = CHATML_TOOLS_TEMPLATE.replace(header, header.replace("\\n'", "\\n\\n'"))
    assert tok.chat_template != CHATML_TOOLS_TEMPLATE
    tok.save_pretrained(tmp_path / "model")
    monkeypatch.setenv("TRACERL_CACHE_DIR", str(tmp_path / "cache"))
    base = ["backend=verl", "backend.dry_run=true", f"backend.model={tmp_path / 'model'}",
            "task.generator_kwargs.rows=5"]
    cfg = compose_tracerl([*base, f"run_dir={tmp_path / 'refused'}"])
    with pytest.raises(ConfigError, match="chat template does not certify: case 'plain'") as refused:
        VerlBackend(cfg).run(cfg)
    assert "gateway.allow_uncertified_template=true" in str(refused.value)
    assert "verl command:" not in capsys.readouterr().out
    cfg = compose_tracerl([*base, f"run_dir={tmp_path / 'allowed'}", "gateway.allow_uncertified_template=true"])
    assert VerlBackend(cfg).run(cfg) == 0
    out = capsys.readouterr()
    assert "warning: training with an uncertified chat template" in out.err and "verl command:" in out.out
    assert json.loads((tmp_path / "allowed" / "template_certificate.json").read_text())["verdict"] == "fails"
    # A launch (not a dry run) whose model files are not here is refused before verl starts.
    cfg = compose_tracerl(["backend=verl", f"backend.model={tmp_path / 'absent'}", "task.generator_kwargs.rows=5",
                           f"run_dir={tmp_path / 'away'}"])
    with pytest.raises(ConfigError, match="cannot load the tokenizer of .* Launch where the model's files are"):
        VerlBackend(cfg).run(cfg)
    assert "verl command:" not in capsys.readouterr().out


def test_batch_parse_metrics_sum_the_rows_parse_counts() -> None:
    """The ``tracerl_sync`` trainer's ``gateway/*`` metrics from its batch's ``tracerl_parse`` entries
    (rows of other agent loops carry None)."""
    from tracerl_verl.rows import batch_parse_metrics

    got = batch_parse_metrics([{"calls": 3, "bad_json": 1}, None, {"text": 2, "no_tools": 4}])
    assert got["gateway/turns_with_tools"] == 6.0 and got["gateway/tool_parse_failed"] == 1 / 6
    assert got["gateway/parse/calls"] == 3.0 and got["gateway/parse/no_tools"] == 4.0
    assert batch_parse_metrics([None, None]) == {}


def test_two_policies_are_refused_at_start_up_naming_why(tmp_path: Path) -> None:
    """verl trains one model per run: ``policies`` with two entries stops ``python -m core.train``
    before the launch is prepared (docs/multi_agent.md); one entry is today's run."""
    run_dir = tmp_path / "run"

    def train(*policies: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "core.train", "backend=verl", "backend.dry_run=true", f"run_dir={run_dir}",
                "task.generator_kwargs.rows=5", *policies,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )

    proc = train("+policies.planner={}", "+policies.coder={}")
    assert proc.returncode != 0
    assert "policies configures 2 policies ['planner', 'coder'], but backend 'verl' trains one policy per run" in proc.stderr
    assert "multi_policy" in proc.stderr
    assert not (run_dir / "verl").exists(), "nothing is prepared for a launch that cannot start"
    one = train("+policies.solver={}")
    assert one.returncode == 0, one.stderr[-2000:]
    assert (run_dir / "verl" / "train.parquet").is_file()

"""``python -m core.train backend=slime``: the dry-run command and the missing-slime exit.

The example is read from docs/backends/slime.md (between the
``slime-dry-run-example`` markers), so the documented command is the tested one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import compose_tracerl
from tracerl_slime.translate import LaunchPaths, slime_train_args

from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "backends" / "slime.md"

pytestmark = [pytest.mark.integration]


def _doc_example() -> list[str]:
    text = DOC.read_text()
    block = re.search(r"<!-- slime-dry-run-example -->\s*```bash\n(.*?)```", text, re.S)
    assert block, "docs/backends/slime.md lost its dry-run example"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "core.train"]
    return argv[3:]


def _train(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("SLIME_DIR", "MEGATRON_DIR")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "core.train", *argv],
        cwd=tmp_path,
        env={**full_env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _flags(printed: str) -> dict[str, list[str]]:
    """``--flag value...`` lines of the printed command."""
    out: dict[str, list[str]] = {}
    for line in printed.splitlines():
        parts = shlex.split(line.rstrip(" \\").strip()) if line.strip().startswith("--") else []
        if parts:
            out.setdefault(parts[0], []).extend(parts[1:])
    return out


def test_documented_example_dry_run(tmp_path: Path) -> None:
    argv = [
        a if not a.startswith("run_dir=") else f"run_dir={tmp_path / 'run'}" for a in _doc_example()
    ]
    proc = _train(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("slime command:\nray job submit")
    assert "-- python3 /root/slime/train.py" in out
    flags = _flags(out)
    work = tmp_path / "run" / "slime"
    assert flags["--address=http://127.0.0.1:8265"] == []
    assert flags["--custom-generate-function-path"] == ["tracerl_slime.generate.generate"]
    assert flags["--custom-reward-post-process-path"] == [
        "tracerl_slime.rewards.post_process_rewards"
    ]
    assert flags["--custom-config-path"] == [str(work / "tracerl_custom.yaml")]
    assert flags["--prompt-data"] == [str(work / "train.jsonl")]
    assert flags["--hf-checkpoint"] == ["/root/Qwen3-4B"]
    assert flags["--ref-load"] == ["/root/Qwen3-4B_torch_dist"]
    assert flags["--rollout-batch-size"] == ["32"] and flags["--n-samples-per-prompt"] == ["8"]
    assert flags["--num-rollout"] == ["200"] and flags["--save-interval"] == ["20"]
    assert flags["--rollout-max-context-len"] == ["16384"]
    assert flags["--router-policy"] == ["consistent_hashing"]
    assert flags["--lr"] == ["1e-06"]
    assert flags["--norm-epsilon"] == ["1e-6"]
    assert flags["--num-layers"] == ["36"] and "--qk-layernorm" in flags
    assert flags["--sglang-context-length"] == ["32768"]
    assert flags["--max-tokens-per-gpu"] == ["9216"] and "--use-dynamic-batch-size" in flags
    assert "--colocate" in flags and "--use-tis" in flags
    # pass-through flags come last, so they win in slime's argparse
    assert out.rstrip().endswith("--recompute-num-layers 1")
    env_line = next(line for line in out.splitlines() if "--runtime-env-json" in line)
    assert '"PYTHONPATH": "/root/Megatron-LM"' in env_line
    # what slime's rollout processes will read from --custom-config-path
    custom = yaml.safe_load((work / "tracerl_custom.yaml").read_text())
    assert list(custom) == ["tracerl"]
    assert custom["tracerl"]["backend"]["name"] == "slime"
    assert custom["tracerl"]["gateway"]["host"] == "0.0.0.0"
    assert custom["tracerl"]["algorithm"]["max_tokens"] == 2048
    # prompt data: one line per payload, the payload in metadata
    first = yaml.safe_load((work / "train.jsonl").read_text().splitlines()[0])
    assert set(first) == {"prompt", "label", "metadata"} and "tracerl_payload" in first["metadata"]


def test_without_slime_a_real_launch_says_how_to_install(tmp_path: Path) -> None:
    proc = _train(["backend=slime", f"run_dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2
    assert "the `slime` package (THUDM/slime) is not importable" in proc.stderr
    assert "git clone https://github.com/THUDM/slime.git" in proc.stderr
    assert "not on PyPI" in proc.stderr
    assert not (tmp_path / "run" / "slime").exists(), (
        "nothing is prepared for a launch that cannot start"
    )


def _paths(tmp_path: Path) -> LaunchPaths:
    return LaunchPaths(str(tmp_path), "t.jsonl", "", "c.yaml", "ckpt")


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("algorithm.name=dapo", "advantage estimator"),
        ("algorithm.loss=cross_entropy", "algorithm.loss"),
        ("algorithm.temperature=0.0", "temperature > 0"),
    ],
)
def test_untranslatable_settings_name_the_fix(tmp_path: Path, override: str, match: str) -> None:
    cfg: Any = compose_tracerl(["backend=slime", "backend.dry_run=true", override])
    with pytest.raises(ConfigError, match=match):
        slime_train_args(cfg, _paths(tmp_path))


def test_real_launch_needs_ref_load(tmp_path: Path) -> None:
    cfg: Any = compose_tracerl(["backend=slime"])
    with pytest.raises(ConfigError, match="convert_hf_to_torch_dist"):
        slime_train_args(cfg, _paths(tmp_path))


def test_loggers_resume_and_separate_rollout_gpus(tmp_path: Path) -> None:
    cfg: Any = compose_tracerl(
        [
            "backend=slime",
            "backend.dry_run=true",
            "backend.colocate=false",
            "backend.rollout_num_gpus=4",
            "trainer.resume=true",
            "trainer.loggers=[console,wandb]",
            "algorithm.normalize_std=false",
        ]
    )
    args = slime_train_args(cfg, _paths(tmp_path))
    assert "--colocate" not in args
    assert args[args.index("--rollout-num-gpus") + 1] == "4"
    assert args[args.index("--load") + 1] == "ckpt"
    assert "--use-wandb" in args and "--disable-grpo-std-normalization" in args


def _args(tmp_path: Path, *overrides: str, loss_config: dict[str, float] | None = None) -> list[str]:
    from omegaconf import open_dict

    cfg: Any = compose_tracerl(["backend=slime", "backend.dry_run=true", *overrides])
    if loss_config is not None:
        with open_dict(cfg):
            cfg.algorithm.loss_config = loss_config
    return slime_train_args(cfg, _paths(tmp_path))


def _value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name", ["grpo", "cispo"])
def test_cispo_loss_selects_slimes_cispo(tmp_path: Path, name: str) -> None:
    """slime trains CISPO only through --advantage-estimator cispo (there is no loss flag);
    before, algorithm.loss=cispo with name=grpo trained PPO-clip."""
    args = _args(tmp_path, "algorithm.loss=cispo", f"algorithm.name={name}", loss_config={})
    assert _value(args, "--advantage-estimator") == "cispo"
    # core's CISPO default: no lower clip (eps 1.0, slime's canonical setting), upper 0.2
    assert (_value(args, "--eps-clip"), _value(args, "--eps-clip-high")) == ("1.0", "0.2")


def test_cispo_honours_a_given_clip_low(tmp_path: Path) -> None:
    args = _args(tmp_path, "algorithm.loss=cispo", loss_config={"clip_low": 0.3, "clip_high": 3.0})
    assert (_value(args, "--eps-clip"), _value(args, "--eps-clip-high")) == ("0.3", "3.0")


def test_ppo_defaults_and_ratio_bounds(tmp_path: Path) -> None:
    args = _args(tmp_path)
    assert _value(args, "--advantage-estimator") == "grpo"
    assert (_value(args, "--eps-clip"), _value(args, "--eps-clip-high")) == ("0.2", "0.2")
    args = _args(tmp_path, loss_config={"clip_low_threshold": 0.7, "clip_high_threshold": 1.28})
    assert (_value(args, "--eps-clip"), _value(args, "--eps-clip-high")) == ("0.3", "0.28")


def test_entropy_and_token_mean_are_translated(tmp_path: Path) -> None:
    args = _args(tmp_path, "+algorithm.loss_config.entropy_coef=0.01")
    assert _value(args, "--entropy-coef") == "0.01"
    # core's default token mean over the whole step is slime's per-token loss
    assert "--calculate-per-token-loss" in args
    assert "--entropy-coef" not in _args(tmp_path)


def test_one_temperature_samples_and_trains(tmp_path: Path) -> None:
    """slime tempers its training logprobs with --rollout-temperature: it is algorithm.temperature."""
    args = _args(tmp_path, "algorithm.temperature=0.7", "+algorithm.loss_config.temperature=0.7")
    assert _value(args, "--rollout-temperature") == "0.7"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.loss=cispo", "algorithm.name=gspo"], "--advantage-estimator cispo"),
        (["algorithm.name=cispo"], "algorithm.loss=cispo"),
        (["algorithm.loss=importance_sampling"], "algorithm.loss='importance_sampling'"),
        (["+algorithm.loss_config.temperature=0.5"], "one temperature"),
        (["+algorithm.loss_config.top_p=0.9"], "top_p"),
        (["+algorithm.loss_config.kl_coef=0.1"], "kl_coef"),
        (["algorithm.token_mean_over=trained"], "token_mean_over"),
    ],
)
def test_settings_slime_would_ignore_are_refused(
    tmp_path: Path, overrides: list[str], match: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        _args(tmp_path, *overrides)


def test_unknown_std_is_refused_at_launch(tmp_path: Path) -> None:
    from omegaconf import open_dict

    cfg: Any = compose_tracerl(["backend=slime", "backend.dry_run=true"])
    with open_dict(cfg):
        cfg.algorithm.std = "mad"
    with pytest.raises(ConfigError, match="algorithm.std='mad'"):
        slime_train_args(cfg, _paths(tmp_path))


def test_two_policies_are_refused_at_start_up_naming_why(tmp_path: Path) -> None:
    """slime trains one model per run: ``policies`` with two entries stops ``python -m core.train``
    before the launch is prepared (docs/multi_agent.md)."""
    run = tmp_path / "run"
    proc = _train(
        ["backend=slime", "backend.dry_run=true", f"run_dir={run}", "+policies.planner={}", "+policies.coder={}"],
        tmp_path,
    )
    assert proc.returncode != 0
    assert "policies configures 2 policies ['planner', 'coder'], but backend 'slime' trains one policy per run" in proc.stderr
    assert "multi_policy" in proc.stderr
    assert not (run / "slime").exists(), "nothing is prepared for a launch that cannot start"
    one = _train(["backend=slime", "backend.dry_run=true", f"run_dir={run}", "+policies.solver={}"], tmp_path)
    assert one.returncode == 0, one.stderr[-2000:]  # one policy is today's run


def test_the_launch_refuses_an_uncertified_template_and_runs_with_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``backend=slime`` certifies the model's chat template before submitting slime, as
    ``python -m core.train`` does for the backends it drives: an ``hf_checkpoint`` whose tokenizer
    has the whitespace-broken template of tests/gateway/test_certify.py is refused (no command
    printed), and prepared with ``gateway.allow_uncertified_template``; ``tiny`` holds."""
    import json

    from tracerl_slime.backend import SlimeBackend

    from core.tokenizer import build_tiny_tokenizer
    from tests.gateway.test_certify import whitespace_template

    tok = build_tiny_tokenizer()
    tok.chat_template = whitespace_template()
    tok.save_pretrained(tmp_path / "model")
    monkeypatch.setenv("TRACERL_CACHE_DIR", str(tmp_path / "cache"))
    base = ["backend=slime", "backend.dry_run=true", f"backend.hf_checkpoint={tmp_path / 'model'}"]
    cfg = compose_tracerl([*base, f"run_dir={tmp_path / 'refused'}"])
    with pytest.raises(ConfigError, match="chat template does not certify: case 'plain'") as refused:
        SlimeBackend(cfg).run(cfg)
    assert "gateway.allow_uncertified_template=true" in str(refused.value)
    assert "slime command:" not in capsys.readouterr().out
    cfg = compose_tracerl([*base, f"run_dir={tmp_path / 'allowed'}", "gateway.allow_uncertified_template=true"])
    assert SlimeBackend(cfg).run(cfg) == 0
    out = capsys.readouterr()
    assert "warning: training with an uncertified chat template" in out.err and "slime command:" in out.out
    assert json.loads((tmp_path / "allowed" / "template_certificate.json").read_text())["verdict"] == "fails"
    cfg = compose_tracerl(["backend=slime", "backend.dry_run=true", f"run_dir={tmp_path / 'tiny'}"])
    assert SlimeBackend(cfg).run(cfg) == 0
    assert json.loads((tmp_path / "tiny" / "template_certificate.json").read_text())["verdict"] == "holds"
    # Prepared away from the model's files (the documented example's /root/Qwen3-4B): a note, not a refusal.
    cfg = compose_tracerl(["backend=slime", "backend.dry_run=true", f"run_dir={tmp_path / 'away'}",
                           f"backend.hf_checkpoint={tmp_path / 'absent'}"])
    assert SlimeBackend(cfg).run(cfg) == 0
    assert "note: cannot load the tokenizer of" in capsys.readouterr().err
    assert not (tmp_path / "away" / "template_certificate.json").exists()

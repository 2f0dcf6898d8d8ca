"""Keys go only where they are meant to (issue #29): the judge's key and the key
``python -m core.eval`` hands its agent travel only over https or to loopback, unless the
operator opts in to plain http (``reward.allow_plain_http``, ``eval.allow_plain_http``).

The agent's environment (an allowlist, not the trainer's credentials), S3 result keys (a
digest, not the session token) and Ray's version and token are checked beside the runtime
each belongs to, with its fixtures: ``tests/runtime/local/test_local_runtime.py``,
``tests/runtime/local/test_s3_channel.py``, ``tests/runtime/ray/test_ray_preflight.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from core.errors import ConfigError
from core.eval.cli import evaluate_config
from core.plugins import load_plugins
from core.rewards.judge import JudgeReward, JudgeRewardConfig
from core.testing.fakes import compose, fake_backend_plugin


def _eval_config(tmp_path: Path, *overrides: str) -> tuple[Any, Any]:
    """``python -m core.eval``'s config over the fake backend, composed in process."""
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    base = ["backend=fake", f"run_dir={tmp_path / 'run'}", "runtime.num_processes=1"]
    return compose([*base, *overrides], plugins), plugins


def test_the_judge_key_is_sent_only_over_https_or_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's key went to any ``reward.endpoint``, plain http included (issue #29)."""

    def judge(endpoint: str, **settings: Any) -> JudgeReward:
        node = OmegaConf.structured(JudgeRewardConfig(endpoint=endpoint, model="j", api_key_env="JUDGE_KEY", **settings))
        return JudgeReward(node)

    monkeypatch.setenv("JUDGE_KEY", "sk-secret")
    with pytest.raises(ConfigError, match=r"clear text.*https.*reward.allow_plain_http=true"):
        judge("http://judge.example.com/v1")
    with pytest.raises(ConfigError, match="clear text"):
        judge("http://10.0.0.5:8000/v1")
    for fine in ("https://judge.example.com/v1", "http://127.0.0.1:9/v1", "http://localhost:9/v1", "http://[::1]:9/v1"):
        assert judge(fine).api_key == "sk-secret"
    assert judge("http://10.0.0.5:8000/v1", allow_plain_http=True).api_key == "sk-secret"  # opted in
    with pytest.raises(ConfigError, match="http"):
        judge("ftp://judge.example.com/v1")
    monkeypatch.delenv("JUDGE_KEY")
    assert judge("http://10.0.0.5:8000/v1").api_key == "EMPTY"  # no key, nothing to leak


def test_the_endpoint_key_is_sent_only_over_https_or_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m core.eval`` handed ``$eval.api_key_env`` to the agent for any
    ``eval.endpoint``, plain http included (issue #29): the judge's rule applies, refused
    before anything is written; ``eval.allow_plain_http=true`` opts in. Past the check the
    runner is a stand-in that stops the run (what follows needs a reachable endpoint)."""
    import core.eval.cli as cli

    async def past_the_check(*_: Any) -> Any:
        raise RuntimeError("past the check")

    monkeypatch.setattr(cli, "_endpoint_runner", past_the_check)
    monkeypatch.setenv("MY_KEY", "sk-secret")
    out = tmp_path / "out"

    def evaluate(endpoint: str, *extra: str) -> None:
        cfg, plugins = _eval_config(tmp_path, f"eval.endpoint={endpoint}", "eval.model=m", "eval.api_key_env=MY_KEY",
                            f"eval.output_dir={out}", "eval.progress=false", *extra)
        asyncio.run(evaluate_config(cfg, plugins))

    for far in ("http://10.0.0.5:8000/v1", "http://api.example.com/v1"):
        with pytest.raises(ConfigError, match=r"eval.endpoint=.* is plain http to .*not loopback: the key in "
                                              r"\$MY_KEY would cross the network in clear text.*https.*"
                                              r"eval.allow_plain_http=true"):
            evaluate(far)
        assert not out.exists()  # refused before anything is written or started
    for fine in ("https://api.example.com/v1", "http://127.0.0.1:9/v1", "http://localhost:9/v1"):
        with pytest.raises(RuntimeError, match="past the check"):
            evaluate(fine)
    with pytest.raises(RuntimeError, match="past the check"):
        evaluate("http://10.0.0.5:8000/v1", "eval.allow_plain_http=true")  # opted in
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(RuntimeError, match="past the check"):
        evaluate("http://10.0.0.5:8000/v1")  # no key, nothing to leak
    with pytest.raises(ConfigError, match=r"eval.endpoint='ftp://x/v1' must be an http\(s\) URL"):
        evaluate("ftp://x/v1")

"""A short training run through the core loop with ``backend=sagemaker``.

Real gateway, real local runtime with agent processes, real HTTP, the plugin
loaded from its entry point, and the SDK's real ``TrainingClient`` and
``SamplingClient``; only AWS is faked (``sagemaker_fakes``, the network edge).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sagemaker_fakes import GROUP, FakeControlPlane
from tracerl_sagemaker import backend as backend_mod
from tracerl_sagemaker.backend import package_arn

from core.errors import TrainingError
from core.plugins import load_plugins
from core.rundir.metrics import read_metrics
from core.testing.fakes import compose
from core.testing.loop_runs import check_async_within_staleness
from core.trainer.loop import Trainer


def _cfg(run_dir: Path, *extra: str) -> tuple[Any, Any]:
    plugins = load_plugins()
    cfg = compose(
        [
            "backend=sagemaker",
            "backend.role_arn=arn:aws:iam::123456789012:role/SageMakerTrainingSessions",
            "backend.region=us-west-2",
            "backend.base_model=huggingface-llm-qwen3-8b",
            f"backend.model_package_group_arn={GROUP}",
            "backend.tokenizer=tiny",
            f"run_dir={run_dir}",
            "trainer.batch_size=1",
            "trainer.group_size=10",
            "trainer.save_every=1",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            "runtime.num_processes=1",
            "task.generator_kwargs.rows=40",
            *extra,
        ],
        plugins,
    )
    return cfg, plugins


@pytest.fixture
def aws(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    digits = [tiny_tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    # a group of 10 rollouts starts its replies with each digit once: rewards always differ
    fake = FakeControlPlane(tiny_tokenizer, vocab=digits, cycle_first=True)
    monkeypatch.setattr(backend_mod, "make_service_client", lambda resolved: fake)
    return fake


@pytest.mark.integration
@pytest.mark.slow
def test_run_rebinds_checkpoints_resumes_and_stops(tmp_path: Path, aws: FakeControlPlane) -> None:
    run_dir = tmp_path / "run"
    cfg, plugins = _cfg(run_dir, "trainer.max_steps=2")
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0

    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["weight_version"] for r in records] == [1, 2]
    assert all(r["rollouts/ok"] == 10 and r["datums"] >= 2 for r in records)
    log = aws.runtime.log
    assert log.training_kinds() == [
        "forwardBackward", "optimizerStep", "saveWeights", "saveState",   # step 1 + checkpoint
        "forwardBackward", "optimizerStep", "saveWeights", "saveState",   # step 2 + final checkpoint
    ]
    assert [m["sequenceNumber"] for _, _, m in log.training] == list(range(1, 9))
    fb = log.training[0][1]
    assert fb["lossFnName"] == "ppo"
    for datum in fb["datumList"]:
        tokens = datum["modelInput"]["chunks"][0]["tokens"]
        inputs = datum["lossFnInputs"]
        assert inputs["target_tokens"]["data"][:-1] == tokens[1:]
        assert inputs["weights"]["dtype"] == "float32" and inputs["weights"]["shape"] == [len(tokens)]
        assert sum(inputs["weights"]["data"]) >= 1
    # every sample after a rebind named the package the sampler was pointed at
    samples = [b for k, b in log.sampling if k == "sample"]
    assert {b.get("modelPackageArn", "") for b in samples} >= {""}
    loads = [b["modelPackageArn"] for k, b in log.sampling if k == "loadWeightsForSampling"]
    assert len(loads) == 2
    assert {b["modelPackageArn"] for b in samples if "modelPackageArn" in b} <= set(loads)
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    checkpoint = state["backend_path"]
    assert ":model-package/tracerl-test/" in checkpoint and checkpoint.endswith("-v2")
    arn = package_arn(checkpoint)
    first_session = "tracerl-0001"
    assert aws.stops[0] == first_session  # stopped at the end of the run, not left billing

    aws.runtime.steps = 0  # a new session starts from the base model
    resumed_cfg, plugins = _cfg(run_dir, "trainer.max_steps=3", "trainer.resume=true")
    trainer = Trainer(resumed_cfg, plugins)
    assert asyncio.run(trainer.run()) == 0
    assert trainer.step == 3
    loads = [b for k, b, _ in log.training if k == "loadState"]
    assert loads == [{"modelPackageArn": arn, "loadOptimizer": True}]
    assert aws.runtime.steps == 3
    # The resumed step serves version 3, not a second version 2 (#28).
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [(r["step"], r["weight_version"]) for r in records][-1] == (3, 3)
    assert "tracerl-0002" in aws.stops


@pytest.mark.integration
def test_session_is_stopped_when_the_run_fails(tmp_path: Path, aws: FakeControlPlane) -> None:
    aws.runtime.fail_next["forwardBackward"] = "ValidationException: datum too long"
    cfg, plugins = _cfg(tmp_path / "run", "trainer.max_steps=1", "trainer.canary=false")
    with pytest.raises(TrainingError, match="datum too long"):
        asyncio.run(Trainer(cfg, plugins).run())
    assert aws.stops[:1] == ["tracerl-0001"]


@pytest.mark.integration
def test_session_is_stopped_on_keyboard_interrupt(
    tmp_path: Path, aws: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def interrupted(self: Any, *a: Any, **k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_one_step", interrupted)
    cfg, plugins = _cfg(tmp_path / "run", "trainer.max_steps=1", "trainer.canary=false")
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(Trainer(cfg, plugins).run())
    assert aws.stops[:1] == ["tracerl-0001"]


@pytest.mark.integration
def test_cli_names_missing_keys_and_exits(tmp_path: Path) -> None:
    """``python -m core.train backend=sagemaker`` with nothing set: exit 1, every key named."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-credentials")
    proc = subprocess.run(
        [sys.executable, "-m", "core.train", "backend=sagemaker", f"run_dir={tmp_path / 'run'}",
         "trainer.progress=false"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    for key in ("backend.role_arn", "backend.region", "backend.base_model", "Nothing was sent"):
        assert key in proc.stderr


@pytest.mark.integration
def test_async_mode_trains_within_the_staleness_bound(tmp_path: Path, aws: FakeControlPlane) -> None:
    """trainer.mode=async: rollouts run while the service trains; the sampler reports the
    version of the client each request started on, so staleness is measured and bounded."""
    check_async_within_staleness(
        _cfg,
        tmp_path / "run",
        # random rewards: every group has a signal, so every step trains and syncs
        "task.agent=loop_agents:long_tail",
        f"+task.agent_env.PYTHONPATH={Path(__file__).parents[3] / 'tests' / 'trainer'}",
    )


def test_tis_cap_is_refused_before_anything_is_sent(tmp_path: Path, aws: FakeControlPlane) -> None:
    from core.errors import ConfigError

    cfg, plugins = _cfg(tmp_path / "run", "algorithm.tis_cap=2.0", "trainer.max_steps=1")
    with pytest.raises(ConfigError, match="cannot truncate importance weights"):
        asyncio.run(Trainer(cfg, plugins).run())

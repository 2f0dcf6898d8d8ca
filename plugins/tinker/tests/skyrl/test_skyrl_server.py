"""The Tinker backend against a real Tinker-API server: SkyRL tx on CPU (marker ``skyrl``).

One server per module, on 127.0.0.1, loading a from-scratch Qwen3 checkpoint
(``skyrl_server``; nothing downloaded). Every test talks to it through the
plugin's real code path (``tinker.ServiceClient`` over HTTP): the shared
conformance suite, each RL loss core sends, ``optim_step``, weight sync,
``save_state`` and resume, and ``python -m core.train backend=tinker``.

Run with ``plugins/tinker/scripts/run_skyrl_tests.sh`` (builds SkyRL's venv).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from skyrl_server import (
    ROOT,
    SKYRL_VERSION,
    Checkpoint,
    SkyrlServer,
    build_checkpoint,
    server_python,
    server_version,
)

from core.interfaces import LOSS_NAMES
from core.testing.build import build_backend
from core.testing.conformance import BackendConformance, MultiPolicyConformance, datum_from_sample
from core.types import AdamParams, SamplingParams

pytestmark = [
    pytest.mark.skyrl,
    pytest.mark.integration,
    pytest.mark.slow,
    # The tinker SDK leaves pooled sockets to the garbage collector after
    # ServiceClient.close() (its HTTP transport, pyqwest, is not ours to close).
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

API_KEY = "tml-local-test"  # SkyRL tx checks no key; the tinker SDK insists on one
LORA_RANK = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return build_checkpoint(tmp_path_factory.mktemp("skyrl-model") / "qwen3-tiny")


@pytest.fixture(scope="module")
def server(checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SkyrlServer]:
    python = server_python()
    if not python.exists():
        pytest.fail(
            f"SkyRL tx's venv is missing ({python}); run plugins/tinker/scripts/run_skyrl_tests.sh "
            "(or setup_skyrl_venv.sh, or set TRACERL_SKYRL_PYTHON)"
        )
    version = server_version(python)
    print(
        f"\nSkyRL tx {version} (skyrl.tinker.api) on CPU; model {checkpoint.config['architectures'][0]} "
        f"{checkpoint.parameters:,} parameters, vocab {checkpoint.vocab_size}, "
        f"{checkpoint.config['num_hidden_layers']} layers x {checkpoint.config['hidden_size']}"
    )
    assert version == SKYRL_VERSION, f"the tier pins skyrl=={SKYRL_VERSION}, the venv has {version}"
    srv = SkyrlServer(python, checkpoint.path, tmp_path_factory.mktemp("skyrl-server"), max_lora_rank=LORA_RANK)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def overrides(server: SkyrlServer, checkpoint: Checkpoint, *extra: str, base_model: bool = True) -> list[str]:
    """``backend=tinker`` pointed at the local server, as a user would set it."""
    return [
        f"backend.base_url={server.base_url}",
        f"backend.api_key={API_KEY}",
        *([f"backend.base_model={checkpoint.path}"] if base_model else []),
        f"backend.tokenizer={checkpoint.path}",
        f"backend.lora_rank={LORA_RANK}",
        "backend.seed=0",
        "backend.request_timeout_s=600",
        *extra,
    ]


@pytest.fixture
def make_backend(server: SkyrlServer, checkpoint: Checkpoint) -> Any:
    def make(*extra: str, base_model: bool = True) -> Any:
        try:
            return build_backend("tinker", overrides(server, checkpoint, *extra, base_model=base_model))
        except Exception:
            print(server.log_tail())
            raise

    return make


class TestSkyrlConformance(BackendConformance):
    """The shared backend contract, against the real server."""

    logprob_atol = 1e-3  # sampler and trainer are one JAX model on one host

    @pytest.fixture
    def backend(self, make_backend: Any) -> Any:
        return make_backend()


class TestSkyrlMultiPolicyConformance(MultiPolicyConformance):
    """Two policies on the real server: each its own LoRA adapter and sampling client, training,
    syncing, saving and restoring apart."""

    @pytest.fixture
    def backends(self, make_backend: Any) -> tuple[Any, Any]:
        return make_backend(), make_backend()


def _prompt(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "After 3?"}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_every_rl_loss_trains_and_moves_the_weights(make_backend: Any) -> None:
    """Each loss core sends is accepted with core's clip settings, returns trainer
    logprobs, and an ``optim_step`` after it changes what the model computes."""
    backend = make_backend()

    async def body() -> None:
        prompt = _prompt(backend.get_tokenizer())
        sample = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=1), session_id="losses"
        )
        assert len(sample.logprobs) == len(sample.token_ids) >= 1
        datum = datum_from_sample(prompt, sample, advantage=1.0)
        for loss in LOSS_NAMES:
            config = {"clip_low": 0.2, "clip_high": 0.28} if loss in ("ppo", "cispo") else None
            before = await backend.forward_backward([datum], loss, config)  # type: ignore[arg-type]
            assert math.isfinite(before.metrics["loss"]), (loss, before.metrics)
            assert len(before.logprobs) == 1 and len(before.logprobs[0]) == len(datum.target_tokens)
            await backend.optim_step(AdamParams(learning_rate=5e-2))
            after = await backend.forward_backward([datum], "cross_entropy")
            moved = max(abs(a - b) for a, b in zip(after.logprobs[0], before.logprobs[0], strict=True))
            assert moved > 1e-6, f"{loss}: optim_step left the logprobs unchanged"
            await backend.optim_step(AdamParams(learning_rate=0.0))  # drop the probe's gradients
        await backend.sync_sampler()
        again = await backend.sampler.sample(prompt, SamplingParams(max_tokens=2), session_id="losses")
        assert again.weight_version == 1

    try:
        asyncio.run(body())
    finally:
        asyncio.run(backend.aclose())


def test_clip_thresholds_reach_the_server(make_backend: Any) -> None:
    """core's ``clip_high`` decides the loss the server computes (SkyRL tx 0.3.0 ignored
    ``loss_fn_config`` and clipped at 1.2 whatever was sent). With the sampler's logprobs
    lowered by 5 nats, every ratio is e^5, so each generated token's PPO loss is
    ``-(1 + clip_high) * A`` and its CISPO loss ``-(1 + clip_high) * A * logprob``."""
    backend = make_backend()

    async def body() -> None:
        prompt = _prompt(backend.get_tokenizer())
        sample = await backend.sampler.sample(prompt, SamplingParams(max_tokens=4, seed=3), session_id="clip")
        datum = datum_from_sample(prompt, sample, advantage=1.0)
        far = dataclasses.replace(
            datum, logprobs=[lp - 5.0 if w > 0 else lp for lp, w in zip(datum.logprobs, datum.weights, strict=True)]
        )
        generated = sum(datum.weights)
        for clip_high in (0.28, 1.0):
            config = {"clip_low": 0.2, "clip_high": clip_high}
            ppo = await backend.forward_backward([far], "ppo", config)
            assert ppo.metrics["loss"] == pytest.approx(-(1 + clip_high) * generated, rel=1e-4)
            cispo = await backend.forward_backward([far], "cispo", config)
            trainer = sum(lp for lp, w in zip(cispo.logprobs[0], datum.weights, strict=True) if w > 0)
            assert cispo.metrics["loss"] == pytest.approx(-(1 + clip_high) * trainer, rel=1e-4)
        await backend.optim_step(AdamParams(learning_rate=0.0))  # drop the accumulated gradients

    try:
        asyncio.run(body())
    finally:
        asyncio.run(backend.aclose())


def test_save_state_then_resume_from_it(make_backend: Any) -> None:
    """``save_state`` returns a tinker:// path; ``backend.resume_from`` starts a new
    training client from it (weights and optimizer) with the same logprobs. No
    ``base_model`` is given: the backend reads it from the checkpoint."""
    first = make_backend()

    async def train_and_save() -> tuple[str, list[float], Any]:
        prompt = _prompt(first.get_tokenizer())
        sample = await first.sampler.sample(prompt, SamplingParams(max_tokens=4, seed=2), session_id="st")
        datum = datum_from_sample(prompt, sample)
        await first.forward_backward([datum], "importance_sampling")
        await first.optim_step(AdamParams(learning_rate=5e-2))
        path = await first.save_state("/run/checkpoints/step_000001/backend")
        probe = await first.forward_backward([datum], "cross_entropy")
        await first.aclose()
        return path, probe.logprobs[0], datum

    path, saved, datum = asyncio.run(train_and_save())
    assert path.startswith("tinker://"), path
    resumed = make_backend(f"backend.resume_from={path}", base_model=False)

    async def probe() -> list[float]:
        try:
            out = await resumed.forward_backward([datum], "cross_entropy")
            return out.logprobs[0]
        finally:
            await resumed.aclose()

    again = asyncio.run(probe())
    assert max(abs(a - b) for a, b in zip(again, saved, strict=True)) <= 1e-5


def train_then_resume(
    server: SkyrlServer, checkpoint: Checkpoint, run_dir: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``python -m core.train backend=tinker`` on the server for two steps (8 rollouts each, a
    checkpoint every step), then resumed for a third; the resumed run's process."""
    common = [
        sys.executable, "-m", "core.train", "backend=tinker",
        *overrides(server, checkpoint),
        f"run_dir={run_dir}",
        "trainer.batch_size=2",
        "trainer.group_size=4",
        "trainer.save_every=1",
        "trainer.eval_every=0",
        "trainer.progress=false",
        "trainer.loggers=[jsonl]",
        "runtime.num_processes=1",
        "task.generator_kwargs.rows=40",
        f"+task.agent_env.PYTHONPATH={ROOT / 'tests' / 'trainer'}",
        *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for steps, more in ((2, []), (3, ["trainer.resume=true"])):
        proc = subprocess.run(
            [*common, f"trainer.max_steps={steps}", *more],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        )
        assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n--- server ---\n{server.log_tail()}"
    return proc


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's per-step metrics records (``metrics.jsonl`` lines with a mean reward)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in (json.loads(line) for line in lines if line.strip()) if "reward/mean" in r]


def test_core_train_runs_and_resumes(server: SkyrlServer, checkpoint: Checkpoint, tmp_path: Path) -> None:
    """``python -m core.train backend=tinker backend.base_url=...`` for two steps, then resumed for a third.

    The agent calls the model like the default task's and returns a random reward
    (``tests/trainer/loop_agents.py``), so every group has a signal and every step
    trains and syncs: a tiny random model scores 0 on the task itself, and a step
    without signal sends nothing to train."""
    run_dir = tmp_path / "run"
    train_then_resume(server, checkpoint, run_dir, "task.agent=loop_agents:long_tail")
    steps = step_records(run_dir)
    for r in steps:
        print(
            f"step {r['step']}: reward {r['reward/mean']:.3f} loss {r['train/loss']} weight_version "
            f"{r['weight_version']} step {r['time/step']:.1f}s (train {r['time/train']:.1f}s, "
            f"weight sync {r['time/weight_sync']:.1f}s)"
        )
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["weight_version"] for r in steps[:2]] == [1, 2]  # one weight sync per step
    assert all(r["datums"] >= 1 and math.isfinite(r["train/loss"]) for r in steps)
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert str(state["backend_path"]).startswith("tinker://")


def test_core_train_with_a_policy_per_role_runs_and_resumes(
    server: SkyrlServer, checkpoint: Checkpoint, tmp_path: Path
) -> None:
    """``python -m core.train backend=tinker task=two_roles +policies.up={} +policies.down={}``
    against the real server for two steps, then resumed for a third: each policy its own LoRA
    adapter, sampling client, weight version and checkpoint on the server, each restored from
    its own on resume.

    The agent plays the two-role relay (one conversation, the roles taking turns, each call
    naming its role as ``model``) and returns a random reward per role
    (``tests/trainer/loop_agents.py``), so both policies train every step."""
    run_dir = tmp_path / "run"
    proc = train_then_resume(
        server, checkpoint, run_dir, "task=two_roles", "+policies.up={}", "+policies.down={}", "algorithm.max_tokens=4",
        "trainer.canary=false", "task.agent=loop_agents:two_roles_random",
    )
    steps = step_records(run_dir)
    for r in steps:
        print(
            f"step {r['step']}: up v{r['policy/up/weight_version']} loss {r['policy/up/loss']:.4f} "
            f"turns {r['policy/up/turns']}; down v{r['policy/down/weight_version']} "
            f"loss {r['policy/down/loss']:.4f} turns {r['policy/down/turns']}; step {r['time/step']:.1f}s"
        )
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # both policies trained and synced every step, the third after the resume
        assert r["policy/up/weight_version"] == r["policy/down/weight_version"] == r["step"]
        assert r["policy/up/turns"] == r["policy/down/turns"] == 8  # 8 rollouts, one turn of each
        assert math.isfinite(r["policy/up/loss"]) and math.isfinite(r["policy/down/loss"])
    paths = {}
    for step in (1, 2):
        state = json.loads((run_dir / "checkpoints" / f"step_00000{step}" / "trainer_state.json").read_text())
        paths[step] = state["policies"]
        assert sorted(state["policies"]) == ["down", "up"]
        assert all(str(p).startswith("tinker://") for p in state["policies"].values())
    # Four checkpoints on the server: one per policy and step, none shared.
    assert len({p for by_policy in paths.values() for p in by_policy.values()}) == 4
    resumed = [line for line in proc.stderr.splitlines() + proc.stdout.splitlines() if "resumed from" in line]
    assert resumed and "step_000002" in resumed[0], "the third step did not resume from step 2's checkpoint"

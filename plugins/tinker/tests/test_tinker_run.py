"""A short training run through the core loop with ``backend=tinker``.

Real gateway, real local runtime with agent processes, real HTTP, the plugin
loaded from its entry point; only the Tinker service is faked
(``tinker_fakes``, the network edge), returning tinker's real types.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tinker_fakes import FakeServiceClient
from tracerl_tinker import backend as backend_mod

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
            "backend=tinker",
            "backend.base_model=Qwen/Qwen3-8B",
            "backend.api_key=tml-test",
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
def service(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> FakeServiceClient:
    digits = [tiny_tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    # a group of 10 rollouts starts its replies with each digit once: rewards always differ
    fake = FakeServiceClient(tiny_tokenizer, vocab=digits, cycle_first=True)
    monkeypatch.setattr(backend_mod, "make_service_client", lambda **kw: fake)
    return fake


@pytest.mark.integration
@pytest.mark.slow
def test_run_rebinds_checkpoints_and_resumes(tmp_path: Path, service: FakeServiceClient) -> None:
    run_dir = tmp_path / "run"
    cfg, plugins = _cfg(run_dir, "trainer.max_steps=2")
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0

    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["weight_version"] for r in records] == [1, 2]  # one rebind per step
    assert all(r["rollouts/ok"] == 10 and r["datums"] >= 2 for r in records)
    # what reached the service: two fwd/bwd of well-formed datums, two Adam steps
    assert len(service.log.forward_backward) == 2 and len(service.log.optim_steps) == 2
    for data, loss_fn, config in service.log.forward_backward:
        assert loss_fn == "ppo" and set(config) == {"clip_low_threshold", "clip_high_threshold"}
        for d in data:
            tokens = d.model_input.to_ints()
            targets = d.loss_fn_inputs["target_tokens"].to_numpy().tolist()
            assert targets[:-1] == tokens[1:]  # shifted by one
            assert set(d.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    # sampling moved to the new client after each step: the initial one plus one per step
    assert len(service.sampling_clients) == 3
    assert [c.steps for c in service.sampling_clients] == [0, 1, 2]
    # a checkpoint per step; the loop stored the tinker:// path to resume from
    state = json.loads((run_dir / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    # named with the weight version each holds, so a resume serves that version
    assert state["backend_path"] == "tinker://run-1/weights/step_000001_backend-v1"
    assert service.log.saves == [
        "tinker://run-1/weights/step_000001_backend-v1",
        "tinker://run-1/weights/step_000002_backend-v2",
    ]
    assert service.log.closes == ["success"]

    resumed_cfg, plugins = _cfg(run_dir, "trainer.max_steps=3", "trainer.resume=true")
    trainer = Trainer(resumed_cfg, plugins)
    assert asyncio.run(trainer.run()) == 0
    assert trainer.step == 3
    assert service.log.creates[-1]["kind"] == "from_state"
    assert service.log.creates[-1]["path"] == "tinker://run-1/weights/step_000002_backend-v2"
    assert service.training_clients[-1].steps == 3  # restored 2 steps, trained 1 more
    assert service.log.closes == ["success", "success"]
    # the version went on from the checkpoint's (it restarted at 1, reusing version 1's label)
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["weight_version"] for r in records if r["step"] == 3] == [3]


@pytest.mark.integration
def test_service_failure_ends_the_session_as_errored(
    tmp_path: Path, service: FakeServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinker_fakes import FakeTrainingClient

    original = FakeTrainingClient.forward_backward

    def failing(self: FakeTrainingClient, *a: Any, **k: Any) -> Any:
        self.fail_next_forward_backward = RuntimeError("service unavailable")
        return original(self, *a, **k)

    monkeypatch.setattr(FakeTrainingClient, "forward_backward", failing)
    cfg, plugins = _cfg(tmp_path / "run", "trainer.max_steps=1", "trainer.canary=false")
    with pytest.raises(TrainingError, match="service unavailable"):
        asyncio.run(Trainer(cfg, plugins).run())
    assert service.log.closes == ["errored"]


@pytest.mark.integration
def test_cli_names_missing_keys_and_exits(tmp_path: Path) -> None:
    """``python -m core.train backend=tinker`` without a model or key: exit 1, both named."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    proc = subprocess.run(
        [sys.executable, "-m", "core.train", "backend=tinker", f"run_dir={tmp_path / 'run'}",
         "trainer.progress=false"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    for key in ("backend.base_model", "backend.api_key", "TINKER_API_KEY", "Nothing was sent"):
        assert key in proc.stderr


@pytest.mark.integration
def test_async_mode_trains_within_the_staleness_bound(tmp_path: Path, service: FakeServiceClient) -> None:
    """trainer.mode=async: rollouts run while the service trains; the sampler reports the
    version of the client each request started on, so staleness is measured and bounded."""
    check_async_within_staleness(
        _cfg,
        tmp_path / "run",
        # random rewards: every group has a signal, so every step trains and syncs
        "task.agent=loop_agents:long_tail",
        f"+task.agent_env.PYTHONPATH={Path(__file__).parents[3] / 'tests' / 'trainer'}",
    )


def test_tis_cap_is_refused_before_anything_is_sent(tmp_path: Path, service: FakeServiceClient) -> None:
    from core.errors import ConfigError

    cfg, plugins = _cfg(tmp_path / "run", "algorithm.tis_cap=2.0", "trainer.max_steps=1")
    with pytest.raises(ConfigError, match="cannot truncate importance weights"):
        asyncio.run(Trainer(cfg, plugins).run())


LOOP_AGENTS = Path(__file__).parents[3] / "tests" / "trainer"
"""tests/trainer/loop_agents.py's folder, put on the agents' PYTHONPATH."""
RANDOM_ROLES = [
    "task=two_roles", "trainer.canary=false", "trainer.eval_every=0",
    "task.agent=loop_agents:two_roles_random", f"+task.agent_env.PYTHONPATH={LOOP_AGENTS}",
]
"""The two-role relay with a random reward per role, so that every policy trains every step."""
TWO_ROLES = [*RANDOM_ROLES, "+policies.up={}", "+policies.down={}"]
"""The two-role relay (each rollout a turn of ``up`` and one of ``down``, in one conversation)
with a policy per role."""


def _turns(run_dir: Path) -> dict[str, dict[str, int]]:
    """Turns of each policy in the run's stored traces, by trace kind (train, eval)."""
    from core.rundir.traces import list_traces, read_traces, rows_of, trace_path

    counts: dict[str, dict[str, int]] = {}
    for kind, steps in list_traces(run_dir).items():
        for step in steps:
            for rollout in read_traces(trace_path(run_dir, kind, step)).rollouts:
                for row in rows_of(rollout):
                    mine = counts.setdefault(row.policy(), {})
                    mine[kind] = mine.get(kind, 0) + len(row.turns)
    return counts


@pytest.mark.integration
@pytest.mark.slow
def test_two_policies_train_on_their_own_clients_and_resume_each(tmp_path: Path, service: FakeServiceClient) -> None:
    """``policies`` with two entries on Tinker: a training client and a sampling client per
    policy, each policy's turns sampled only by its own clients, a version per policy, a
    checkpoint per policy named for it and its version, and a resume that restores each."""
    run_dir = tmp_path / "run"
    cfg, plugins = _cfg(run_dir, *TWO_ROLES, "trainer.max_steps=2")
    trainer = Trainer(cfg, plugins)
    assert asyncio.run(trainer.run()) == 0

    up, down = trainer.policies["up"], trainer.policies["down"]
    assert trainer.policies.versions() == {"up": 2, "down": 2}
    # One LoRA training client per policy, each trained twice.
    assert [c["kind"] for c in service.log.creates] == ["lora", "lora"]
    assert len(service.training_clients) == 2
    assert {id(up._training), id(down._training)} == {id(c) for c in service.training_clients}
    assert [c.steps for c in service.training_clients] == [2, 2]
    assert trainer.gateway.sampler_of("up") is up.sampler and trainer.gateway.sampler_of("down") is down.sampler
    # Each policy's turns were sampled by its own clients: the initial one and one per step.
    clients = {
        name: [c for c in service.sampling_clients if c.trainer is backend._training]
        for name, backend in (("up", up), ("down", down))
    }
    assert {name: [c.steps for c in mine] for name, mine in clients.items()} == {"up": [0, 1, 2], "down": [0, 1, 2]}
    # Two steps of 10 rollouts, and the evaluations before the first step and at the end,
    # each rollout one turn of each policy; every turn sampled by its own policy's clients.
    turns = _turns(run_dir)
    assert turns["up"]["train"] == turns["down"]["train"] == 20
    assert turns["up"]["eval"] == turns["down"]["eval"] > 0
    assert {name: sum(c.sampled for c in mine) for name, mine in clients.items()} == {
        name: sum(kinds.values()) for name, kinds in turns.items()
    }
    # A checkpoint per policy and step, named for the policy and the version it holds.
    assert sorted(service.log.saves) == sorted(
        f"tinker://run-1/weights/step_00000{step}_backend_{name}-v{step}" for step in (1, 2) for name in ("up", "down")
    )
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["policies"] == {
        name: f"tinker://run-1/weights/step_000002_backend_{name}-v2" for name in ("up", "down")
    }
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    for r in records:
        for name in ("up", "down"):
            assert r[f"policy/{name}/weight_version"] == r["step"]
            assert r[f"policy/{name}/turns"] == 10
            assert isinstance(r[f"policy/{name}/loss"], float)
    assert service.log.closes == ["success", "success"]

    resumed_cfg, plugins = _cfg(run_dir, *TWO_ROLES, "trainer.max_steps=3", "trainer.resume=true")
    resumed = Trainer(resumed_cfg, plugins)
    assert asyncio.run(resumed.run()) == 0
    # Each policy restored from its own checkpoint into its own client, then trained once more.
    restored = [c for c in service.log.creates if c["kind"] == "from_state"]
    assert sorted(c["path"] for c in restored) == sorted(state["policies"].values())
    assert resumed.policies.versions() == {"up": 3, "down": 3}
    assert [c.steps for c in service.training_clients[-2:]] == [3, 3]
    step3 = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == 3 and "reward/mean" in r]
    assert [(r["policy/up/weight_version"], r["policy/down/weight_version"]) for r in step3] == [(3.0, 3.0)]
    assert service.log.closes == ["success"] * 4


@pytest.mark.integration
@pytest.mark.slow
def test_two_policies_in_async_mode_age_each_turn_against_its_own_policy(
    tmp_path: Path, service: FakeServiceClient
) -> None:
    """``trainer.mode=async`` with a policy per role on Tinker: each policy's turns are
    sampled by its own clients while the other trains, and staleness is read per policy
    (docs/multi_agent.md): both first groups ran on each policy's version 0, so the second
    step trains each policy's turns one version late, never more."""
    run_dir = tmp_path / "run"
    cfg, plugins = _cfg(run_dir, *TWO_ROLES, "trainer.max_steps=3", "trainer.mode=async", "trainer.max_staleness=1")
    trainer = Trainer(cfg, plugins)
    assert asyncio.run(trainer.run()) == 0
    assert trainer.policies.versions() == {"up": 3, "down": 3}
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        ages = [r[f"policy/{name}/staleness_max"] for name in ("up", "down")]
        assert all(age <= 1 for age in ages)
        assert r["async/staleness_max"] == max(ages) and r["async/group_staleness_max"] == max(ages)
    assert records[1]["policy/up/staleness_max"] == records[1]["policy/down/staleness_max"] == 1
    up, down = trainer.policies["up"], trainer.policies["down"]
    clients = {
        name: [c for c in service.sampling_clients if c.trainer is backend._training]
        for name, backend in (("up", up), ("down", down))
    }
    # A weight push per policy and step, each to its own sampling client, while rollouts ran.
    pushes = {name: [c.steps for c in mine] for name, mine in clients.items()}
    assert pushes == {"up": [0, 1, 2, 3], "down": [0, 1, 2, 3]}


@pytest.mark.integration
@pytest.mark.slow
def test_each_policy_trains_with_its_own_rank_learning_rate_loss_and_max_tokens(
    tmp_path: Path, service: FakeServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``policies.<name>`` settings on Tinker: ``backend.lora_rank`` reaches that policy's
    training client, its learning rate that client's Adam steps, its loss that client's
    forward_backward, and its ``max_tokens`` that policy's sampling clients (docs/multi_agent.md)."""
    from tinker_fakes import FakeSamplingClient, FakeTrainingClient

    losses: list[tuple[Any, str]] = []
    rates: list[tuple[Any, float]] = []
    budgets: list[tuple[Any, int]] = []
    forward_backward, optim_step, sample = (
        FakeTrainingClient.forward_backward, FakeTrainingClient.optim_step, FakeSamplingClient.sample,
    )

    def spy_fb(self: Any, data: Any, loss_fn: str, loss_fn_config: Any = None) -> Any:
        losses.append((self, loss_fn))
        return forward_backward(self, data, loss_fn, loss_fn_config)

    def spy_optim(self: Any, adam: Any) -> Any:
        rates.append((self, adam.learning_rate))
        return optim_step(self, adam)

    def spy_sample(self: Any, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        budgets.append((self.trainer, sampling_params.max_tokens))
        return sample(self, prompt, num_samples, sampling_params)

    monkeypatch.setattr(FakeTrainingClient, "forward_backward", spy_fb)
    monkeypatch.setattr(FakeTrainingClient, "optim_step", spy_optim)
    monkeypatch.setattr(FakeSamplingClient, "sample", spy_sample)
    run_dir = tmp_path / "run"
    cfg, plugins = _cfg(
        run_dir, *RANDOM_ROLES, "trainer.max_steps=1", "backend.lora_rank=32", "algorithm.learning_rate=0.001",
        "algorithm.loss=ppo", "algorithm.max_tokens=8",
        "+policies.up={backend:{lora_rank:8},learning_rate:0.002,max_tokens:3}",
        "+policies.down={loss:cispo}",
    )
    trainer = Trainer(cfg, plugins)
    assert asyncio.run(trainer.run()) == 0
    assert [(c["kind"], c["rank"]) for c in service.log.creates] == [("lora", 8), ("lora", 32)]
    up, down = trainer.policies["up"]._training, trainer.policies["down"]._training
    assert sorted((id(c), fn) for c, fn in losses) == sorted([(id(up), "ppo"), (id(down), "cispo")])
    assert sorted((id(c), lr) for c, lr in rates) == sorted([(id(up), 0.002), (id(down), 0.001)])
    assert {(c is up, n) for c, n in budgets} == {(True, 3), (False, 8)}


def test_a_policy_temperature_tinker_cannot_train_is_refused_at_start_up_naming_the_policy(
    tmp_path: Path, service: FakeServiceClient
) -> None:
    """Tinker's forward_backward takes no temperature: a policy's own ``temperature`` with a ratio
    loss is refused before any rollout, as the run's would be."""
    from core.errors import ConfigError

    cfg, plugins = _cfg(tmp_path / "run", "task=two_roles", "+policies.up={temperature:0.5}", "+policies.down={}")
    with pytest.raises(ConfigError, match=r"policies\.up \(with its own settings\): backend 'tinker' cannot train loss 'ppo' at algorithm\.temperature=0\.5"):
        asyncio.run(Trainer(cfg, plugins).run())
    assert service.log.forward_backward == [] and service.log.samples == []

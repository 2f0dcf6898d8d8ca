"""Per-policy settings (``policies.<name>.learning_rate``, ``loss``, ``loss_config``, sampling):
read with pydantic at the edge, each policy's ``algorithm`` the run's with its own settings over
it, and the loop's update trains each policy with its own (docs/multi_agent.md).

The update tests drive ``Trainer._update`` with two real local backends (tiny model, built from
the same seed, so they start from the same weights) on the same datums; no gateway or agents:
the datums are what a step would hand the update.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from core.errors import ConfigError
from core.plugins import load_plugins
from core.testing.build import compose_config
from core.testing.fakes import compose
from core.trainer.config import AlgorithmConfig, load_train_config
from core.trainer.loop import Trainer
from core.trainer.metrics import StepTimes
from core.trainer.overrides import LossSampling
from core.trainer.policies import PolicyBackends
from core.trainer.policy_config import PolicyConfig, policy_algorithm, read_policies
from core.trainer.signal import StepSignal
from core.types import Datum, PolicySampling

HERE = Path(__file__).parent


def test_a_policys_settings_override_the_runs_algorithm_and_the_rest_stays() -> None:
    cfg = load_train_config(
        compose_config([
            "algorithm.learning_rate=0.001",
            "+policies.planner={learning_rate:0.01,loss:cispo,loss_config:{clip_high:0.3},temperature:0.7,max_tokens:4}",
            "+policies.coder={}",
        ])
    )
    planner = policy_algorithm(cfg.algorithm, "planner", cfg.policies["planner"])
    assert (planner.learning_rate, planner.loss, planner.loss_config) == (0.01, "cispo", {"clip_high": 0.3})
    assert (planner.temperature, planner.max_tokens) == (0.7, 4)
    assert planner.normalize_std == cfg.algorithm.normalize_std and planner.beta1 == cfg.algorithm.beta1
    assert policy_algorithm(cfg.algorithm, "coder", cfg.policies["coder"]) is cfg.algorithm


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+policies.planner={lr:0.01}"], r"policies\.planner\.lr: unknown setting; a policy takes models, learning_rate"),
        (["+policies.planner={learning_rate:-1}"], r"policies\.planner\.learning_rate: Input should be greater than 0"),
        (["+policies.planner={max_tokens:0}"], r"policies\.planner\.max_tokens: Input should be greater than or equal to 1"),
        (["+policies.planner={loss_config:{clip_high:x}}"], r"policies\.planner\.loss_config\.clip_high"),
        (["+policies.planner={loss:hinge}"], r"policies\.planner .*algorithm\.loss='hinge'"),
        # The run's ppo clip range is the policy's too, unless it gives its own loss_config.
        (["+policies.planner={loss:importance_sampling}", "+algorithm.loss_config.clip_low=0.1"],
         r"policies\.planner .*clips nothing"),
        (["+policies.planner=3"], r"policies\.planner must be a mapping of settings"),
    ],
)
def test_bad_policy_settings_are_refused_naming_the_policy_and_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_train_config(compose_config(overrides))


def test_a_policys_loss_config_replaces_the_runs_whole() -> None:
    cfg = load_train_config(
        compose_config([
            "+algorithm.loss_config.clip_low=0.1",
            "+policies.a={loss:importance_sampling,loss_config:{}}",
        ])
    )
    assert policy_algorithm(cfg.algorithm, "a", cfg.policies["a"]).loss_config == {}


def test_read_policies_takes_typed_entries_and_empty_ones() -> None:
    assert read_policies(None) == {}
    assert read_policies({"a": None, "b": PolicyConfig(learning_rate=0.5)}) == {
        "a": PolicyConfig(),
        "b": PolicyConfig(learning_rate=0.5),
    }


# -- the update trains each policy with its own settings ----------------------------------


class _SamplerRecorder:
    """The gateway's one method the update calls: the policies whose new sampler it was handed."""

    def __init__(self) -> None:
        self.policies: list[str | None] = []

    def set_sampler(self, sampler: Any, *, policy: str | None = None) -> None:
        self.policies.append(policy)


def _datums(backend: Any, n: int = 4) -> list[Datum]:
    """Rows of random tokens, every target trained with advantage 1 (sampler logprobs 0:
    importance_sampling's ratio is then the model's probability, never clipped)."""
    vocab = len(backend.get_tokenizer())
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (9,), generator=gen).tolist()
        out.append(Datum(ids[:-1], ids[1:], [0.0] * 8, [1.0] * 8, [1.0] * 8))
    return out


def _trainer(*overrides: str) -> tuple[Trainer, dict[str, Any]]:
    """A ``Trainer`` for policies ``up`` and ``down`` with a local backend each (not started:
    only its update is driven)."""
    plugins = load_plugins()
    cfg = compose(["backend=local", "run_dir=unused", "seed=3", *overrides], plugins)
    trainer = Trainer(cfg, plugins)
    spec = plugins.backend("local")
    backends = {name: spec.factory(cfg) for name in ("up", "down")}
    trainer.policies = PolicyBackends(backends)
    trainer.backend = trainer.policies.default
    trainer.gateway = _SamplerRecorder()  # type: ignore[assignment]
    return trainer, backends


def _update(trainer: Trainer, datums: list[Datum]) -> dict[str, float]:
    signal = StepSignal(datums=[*datums, *datums], policies=["up"] * len(datums) + ["down"] * len(datums))
    try:
        return asyncio.run(trainer._update(signal, StepTimes()))
    finally:
        for backend in trainer.policies.backends.values():
            asyncio.run(backend.aclose())


def _params(backend: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in backend.model.named_parameters()}


def test_two_policies_with_other_learning_rates_move_by_other_amounts_on_the_same_data() -> None:
    """Adam's first step is about the learning rate times the sign of the gradient: on the same
    datums from the same weights, a policy with 10x the learning rate moves 10x as far."""
    trainer, backends = _trainer(
        "algorithm.loss=importance_sampling",
        "algorithm.grad_clip_norm=0",
        "+policies.up={learning_rate:0.001}",
        "+policies.down={learning_rate:0.01}",
    )
    before = {name: _params(b) for name, b in backends.items()}
    assert all(torch.equal(before["up"][k], before["down"][k]) for k in before["up"])
    metrics = _update(trainer, _datums(backends["up"]))
    moved = {
        name: torch.cat([(_params(b)[k] - before[name][k]).flatten() for k in before[name]]).abs().sum().item()
        for name, b in backends.items()
    }
    assert moved["up"] > 0
    assert moved["down"] / moved["up"] == pytest.approx(10.0, rel=0.02)
    assert metrics["policy/up/learning_rate"] == 0.001
    assert metrics["policy/down/learning_rate"] == 0.01
    assert sorted(trainer.gateway.policies) == ["down", "up"]  # type: ignore[attr-defined]  # each pushed once


def test_each_policys_loss_and_loss_config_reach_its_own_backend() -> None:
    trainer, backends = _trainer(
        "algorithm.loss=ppo",
        "algorithm.temperature=1.0",
        "+policies.up={}",
        "+policies.down={loss:cispo,loss_config:{clip_high:0.5},temperature:0.5}",
    )
    calls: dict[str, list[tuple[str, dict[str, float]]]] = {"up": [], "down": []}
    for name, backend in backends.items():
        real = backend.forward_backward

        async def spy(datums: Any, loss_fn: str, loss_config: Any, *, _name: str = name, _real: Any = real) -> Any:
            calls[_name].append((loss_fn, dict(loss_config)))
            return await _real(datums, loss_fn, loss_config)

        backend.forward_backward = spy
    _update(trainer, _datums(backends["up"]))
    assert calls["up"] == [("ppo", {**trainer.algo.loss_config, "temperature": 1.0})]  # the run's
    assert calls["down"] == [("cispo", {"clip_high": 0.5, "temperature": 0.5})]


def test_a_policy_without_settings_trains_with_the_runs_algorithm() -> None:
    trainer, _ = _trainer("+policies.up={}", "+policies.down={learning_rate:0.5}")
    assert trainer.policy_algos["up"] is trainer.algo
    assert trainer.policy_algos["down"] == AlgorithmConfig(
        **{**trainer.algo.__dict__, "learning_rate": 0.5}
    )
    for backend in trainer.policies.backends.values():
        asyncio.run(backend.aclose())


def test_sessions_sample_each_policy_with_its_own_settings_and_its_loss_assumes_them() -> None:
    """The default policy's settings are the session's; another policy's own ride along in
    ``by_policy`` only where they differ (an evaluation at each policy's eval temperature)."""
    trainer, _ = _trainer(
        "algorithm.temperature=1.0",
        "algorithm.max_tokens=8",
        "+policies.up={temperature:0.5,eval_temperature:0.2}",
        "+policies.down={max_tokens:3,loss_config:{top_p:0.9}}",
    )
    train = trainer._sampling()
    assert (train.temperature, train.max_tokens, train.top_p) == (0.5, 8, 1.0)
    assert train.by_policy == (("down", PolicySampling(temperature=1.0, top_p=0.9, top_k=-1, max_tokens=3)),)
    assert trainer._group_sampling(0).by_policy == train.by_policy
    evaluation = trainer._sampling(evaluation=True)
    assert evaluation.temperature == 0.2
    assert evaluation.by_policy == (("down", PolicySampling(temperature=0.0, top_p=0.9, top_k=-1, max_tokens=3)),)
    assert trainer.loss_samplings == {
        "up": LossSampling(temperature=0.5, top_p=1.0, top_k=-1),
        "down": LossSampling(temperature=1.0, top_p=0.9, top_k=-1),
    }
    for backend in trainer.policies.backends.values():
        asyncio.run(backend.aclose())


def test_one_policy_with_its_own_sampling_needs_no_by_policy() -> None:
    """One policy's settings are the session's own: nothing rides along (a gateway shard, which
    serves one policy, sends the session's plain settings)."""
    plugins = load_plugins()
    trainer = Trainer(compose(["run_dir=unused", "+policies.solo={temperature:0.7,max_tokens:5}"], plugins), plugins)
    sampling = trainer._sampling()
    assert (sampling.temperature, sampling.max_tokens, sampling.by_policy) == (0.7, 5, ())


def test_a_backend_running_its_own_trainer_refuses_a_policys_own_settings() -> None:
    """slime (and verl) read ``algorithm`` only: one policy's learning rate would be ignored."""
    from core.trainer.guards import check_policy_settings

    plugins = load_plugins()
    slime, local = plugins.backend("slime"), plugins.backend("local")
    cfg = compose_config([])
    mine = {"solo": PolicyConfig(models=["m"], learning_rate=0.01, temperature=0.5)}
    check_policy_settings(cfg, mine, local)
    check_policy_settings(cfg, {"solo": PolicyConfig(models=["m"])}, slime)  # routing only: fine
    with pytest.raises(ConfigError, match=r"policies\.solo sets \['learning_rate', 'temperature'\], but backend 'slime' runs its own trainer"):
        check_policy_settings(cfg, mine, slime)
    with pytest.raises(ConfigError, match=r"policies\.solo\.backend\.lora_rank: backend 'slime' cannot set 'lora_rank' per policy; it takes none"):
        check_policy_settings(cfg, {"solo": PolicyConfig(backend={"lora_rank": 8})}, slime)


@pytest.mark.integration
def test_a_resumed_run_goes_on_with_each_policys_own_settings(tmp_path: Path) -> None:
    """Through ``python -m core.train``: the policies' settings are among the overrides the run
    records, so ``trainer.resume=true`` alone trains step 2 with them again (up's learning rate and
    temperature, down's the run's). Real local backend, gateway and agent processes."""
    from core.rundir.metrics import read_metrics
    from core.rundir.traces import read_traces, rows_of, trace_path
    from core.train import main

    run_dir = tmp_path / "run"
    first = [
        f"run_dir={run_dir}", "task=two_roles", "trainer.max_steps=1", "trainer.batch_size=2", "trainer.group_size=4",
        "trainer.eval_every=0", "trainer.save_every=1", "trainer.canary=false", "trainer.progress=false",
        "trainer.loggers=[jsonl]", "runtime.num_processes=1", "task.generator_kwargs.rows=20",
        "algorithm.learning_rate=0.001", "algorithm.temperature=1.0",
        "task.agent=loop_agents:two_roles_parity", f"+task.agent_env.PYTHONPATH={HERE}",
        "+policies.up={learning_rate:0.002,temperature:0.5}", "+policies.down={}",
    ]
    assert main(first) == 0
    assert main([f"run_dir={run_dir}", "trainer.resume=true", "trainer.max_steps=2"]) == 0
    (step2,) = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == 2 and "reward/mean" in r]
    assert (step2["policy/up/learning_rate"], step2["policy/down/learning_rate"]) == (0.002, 0.001)
    sampled: dict[str, set[float]] = {}
    for rollout in read_traces(trace_path(run_dir, "train", 2)).rollouts:
        for row in rows_of(rollout):
            sampled.setdefault(row.policy(), set()).update(p["temperature"] for p in row.metadata["turn_params"])
    assert sampled == {"up": {0.5}, "down": {1.0}}

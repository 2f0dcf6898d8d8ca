"""A policy's own backend settings on the local backend (``policies.<name>.backend.lora.*``):
each policy is a model copy of its own, so its LoRA adapter (rank, alpha, targets) may be its
own; a setting the backend cannot honour is refused before anything starts
(docs/multi_agent.md). Real tiny model and peft; the config goes through
``policy_backend_config`` and the plugin's factory, as core's loop and eval build a policy."""

from __future__ import annotations

from typing import Any

import pytest
from local_helpers import run

from core.errors import ConfigError
from core.plugins import load_plugins
from core.plugins.policy_backend import policy_backend_config
from core.testing.build import compose_config
from core.trainer.config import load_train_config


def _build(*overrides: str) -> dict[str, Any]:
    cfg = compose_config(["backend=local", *overrides])
    policies = load_train_config(cfg).policies
    spec = load_plugins().backend("local")
    return {name: spec.factory(policy_backend_config(cfg, name, p.backend, spec)) for name, p in policies.items()}


def _ranks(backend: Any) -> set[int]:
    """The ranks of the model's LoRA adapters (the A matrices' rows); empty without LoRA."""
    return {p.shape[0] for n, p in backend.model.named_parameters() if "lora_A" in n}


def test_each_policy_gets_the_adapter_rank_it_sets() -> None:
    pytest.importorskip("peft", reason="LoRA needs the tracerl-local[lora] extra")
    backends = _build(
        "backend.lora.enabled=true",
        "backend.lora.rank=8",
        "+policies.planner={backend:{lora:{rank:2,target_modules:[q_proj]}}}",
        "+policies.coder={}",
    )
    try:
        planner, coder = backends["planner"], backends["coder"]
        assert _ranks(planner) == {2} and _ranks(coder) == {8}
        assert planner.config.lora.rank == 2 and coder.config.lora.rank == 8  # each saves its own
        targets = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in planner.model.named_parameters() if "lora_A" in n}
        assert targets == {"q_proj"}
    finally:
        for backend in backends.values():
            run(backend.aclose())


def test_a_policy_may_train_an_adapter_while_another_trains_the_full_model() -> None:
    pytest.importorskip("peft", reason="LoRA needs the tracerl-local[lora] extra")
    backends = _build("+policies.planner={backend:{lora:{enabled:true,rank:4}}}", "+policies.coder={}")
    try:
        planner, coder = backends["planner"], backends["coder"]
        assert _ranks(planner) == {4} and _ranks(coder) == set()
        assert all(p.requires_grad for p in coder.model.parameters())
        assert all("lora_" in n for n, p in planner.model.named_parameters() if p.requires_grad)
    finally:
        for backend in backends.values():
            run(backend.aclose())


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("{backend:{lora:{rank:4}}}", r"policies\.planner\.backend: sets \['lora\.rank'\], but LoRA is off for this policy"),
        ("{backend:{model:gpt2}}", r"policies\.planner\.backend\.model: backend 'local' cannot set 'model' per policy; it takes \['lora\.enabled'"),
        ("{backend:{lora:{rank:many}}}", r"policies\.planner\.backend\.lora\.rank: Value .many. of type .str. could not be converted to Integer \(docs"),
    ],
)
def test_a_setting_the_backend_cannot_honour_is_refused_naming_the_policy_and_key(policy: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _build(f"+policies.planner={policy}", "+policies.coder={}")

"""A policy's own backend settings on the local backend (``policies.<name>.backend.lora.*``):
each policy is a model copy of its own, so its LoRA adapter (rank, alpha, targets) may be its
own; a setting the backend cannot honour is refused before anything starts
(docs/multi_agent.md). Real tiny model and peft; the config goes through
``policy_backend_config`` and the plugin's factory, as core's loop and eval build a policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from local_helpers import run

from core.errors import ConfigError
from core.plugins import load_plugins
from core.plugins.policy_backend import check_policy_tokenizers, policy_backend_config
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
        ("{backend:{device:cpu}}", r"policies\.planner\.backend\.device: backend 'local' cannot set 'device' per policy; it takes \['model'"),
        ("{backend:{model:gpt2,tiny:{num_layers:1}}}", r"policies\.planner\.backend: sets \['tiny\.num_layers'\], but this policy's model is 'gpt2'"),
        ("{backend:{lora:{rank:many}}}", r"policies\.planner\.backend\.lora\.rank: Value .many. of type .str. could not be converted to Integer \(docs"),
    ],
)
def test_a_setting_the_backend_cannot_honour_is_refused_naming_the_policy_and_key(policy: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _build(f"+policies.planner={policy}", "+policies.coder={}")


def test_a_policy_may_be_another_model_that_reads_the_same_tokens(tmp_path: Path) -> None:
    """``backend.model`` per policy: a tiny model of another shape, and a model directory (the
    tiny preset saved with ``save_pretrained``, loaded through transformers), beside the run's."""
    source = _build("+policies.solo={}")["solo"]
    saved = tmp_path / "saved"
    source.model.save_pretrained(saved)
    source.get_tokenizer().save_pretrained(saved)
    run(source.aclose())
    backends = _build(
        "+policies.planner={}",
        "+policies.coder={backend:{tiny:{hidden_size:32,num_layers:1}}}",
        f"+policies.critic={{backend:{{model:'{saved}'}}}}",
    )
    try:
        check_policy_tokenizers(backends)
        widths = {name: b.model.config.hidden_size for name, b in backends.items()}
        assert widths == {"planner": 64, "coder": 32, "critic": 64}
        assert backends["coder"].model.config.num_hidden_layers == 1
        assert backends["critic"].model_id() == str(saved)
    finally:
        for backend in backends.values():
            run(backend.aclose())


class _Tokens:
    def __init__(self, vocab: dict[str, int], template: str = "t") -> None:
        self.vocab, self.chat_template = vocab, template

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


class _Named:
    def __init__(self, model: str, tokenizer: _Tokens) -> None:
        self.model, self.tokenizer = model, tokenizer

    def get_tokenizer(self) -> _Tokens:
        return self.tokenizer

    def model_id(self) -> str:
        return self.model


def test_policies_whose_models_read_other_tokens_are_refused_naming_the_policy() -> None:
    """The gateway renders every policy's turns with the first policy's tokenizer."""
    same = _Named("a", _Tokens({"x": 0}))
    check_policy_tokenizers({"planner": same, "coder": _Named("b", _Tokens({"x": 0}))})
    for other in (_Tokens({"y": 0}), _Tokens({"x": 0}, template="other")):
        with pytest.raises(ConfigError, match=r"policies\.coder: its model 'b' has another tokenizer or chat template than policy 'planner' \(model 'a'\)"):
            check_policy_tokenizers({"planner": same, "coder": _Named("b", other)})

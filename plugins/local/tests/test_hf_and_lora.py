"""Loading a Hugging Face model from a directory, and LoRA through peft.

The "Hugging Face model" is the tiny preset written with ``save_pretrained``
into a temporary directory: the real loading path (AutoModelForCausalLM,
AutoTokenizer) runs, offline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from local_helpers import chat_prompt, make_datum, run
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig, LoraConfig

from core.errors import ConfigError
from core.types import AdamParams, SamplingParams


@pytest.fixture
def saved_tiny(tmp_path: Path) -> tuple[Path, LocalBackend]:
    source = LocalBackend(LocalBackendConfig(), seed=2)
    out = tmp_path / "tiny-hf"
    source.model.save_pretrained(out)
    source.get_tokenizer().save_pretrained(out)
    yield out, source
    run(source.aclose())


def test_loads_a_model_directory_like_the_tiny_preset(saved_tiny, make_backend) -> None:
    path, source = saved_tiny
    loaded = make_backend(model=str(path))
    assert loaded.model_id() == str(path)
    prompt = chat_prompt(source)
    assert chat_prompt(loaded) == prompt  # same tokenizer and chat template
    greedy = SamplingParams(max_tokens=8, temperature=0)

    async def go() -> None:
        a = await source.sampler.sample(prompt, greedy, session_id="a")
        b = await loaded.sampler.sample(prompt, greedy, session_id="b")
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)

    run(go())


def test_missing_model_is_a_config_error(make_backend, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="could not be loaded"):
        make_backend(model=str(tmp_path / "nope"))


def test_lora_trains_only_adapters_and_saves_them(make_backend, tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="LoRA needs the tracerl-local[lora] extra")
    lora = LoraConfig(enabled=True, rank=4, alpha=8)
    backend = make_backend(seed=0, lora=lora)
    trainable = [n for n, p in backend.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen_before = {
        n: p.detach().clone() for n, p in backend.model.named_parameters() if not p.requires_grad
    }
    prompt = chat_prompt(backend)

    async def go() -> None:
        s = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=6, seed=0), session_id="s"
        )
        datum = make_datum(prompt, s, 1.0)
        out = await backend.forward_backward([datum], "ppo")
        assert (
            out.metrics["logprob_diff/max"] < 1e-4
        )  # sampler copy and trainer agree with adapters
        for _ in range(3):
            await backend.forward_backward([datum], "importance_sampling")
            await backend.optim_step(AdamParams(learning_rate=1e-2))
        after = await backend.forward_backward([datum], "importance_sampling")
        assert after.metrics["loss"] < out.metrics["loss"]  # -ratio*A went down: the policy moved
        where = await backend.save_state(str(tmp_path / "lora"))
        saved = torch.load(Path(where) / "state.pt", weights_only=True)["model"]
        assert saved and all("lora_" in k for k in saved)
        other = make_backend(seed=0, lora=lora)
        await other.load_state(where)
        for (n, p), q in zip(
            backend.model.named_parameters(), other.model.parameters(), strict=True
        ):
            assert torch.equal(p, q), n

    run(go())
    for n, p in backend.model.named_parameters():
        if n in frozen_before:
            assert torch.equal(p, frozen_before[n]), n

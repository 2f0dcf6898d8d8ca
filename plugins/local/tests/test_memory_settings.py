"""The trainer's memory settings change where memory goes, never the numbers.

Chunked logprobs (``train_logprob_chunk``), token-budget micro-batches
(``train_tokens_per_micro_batch``) and gradient checkpointing must give the
logprobs, losses and gradients of the plain computation; bf16 must be accepted
and run. How much memory they save is measured by benchmarks/train_memory.py,
not here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from local_helpers import chat_prompt, make_datum, run
from tracerl_local.backend import LocalBackend
from tracerl_local.chunked import check_split, split_head
from tracerl_local.config import LocalBackendConfig
from tracerl_local.learning_rate import learning_rate_advice
from tracerl_local.losses import parse_loss_config
from tracerl_local.model import enable_checkpointing, model_forward
from tracerl_local.training import TrainShape, micro_batches, trainer_logprobs_and_entropy

from core.errors import ConfigError
from core.types import Datum, SamplingParams


def _datums(backend: LocalBackend, n: int = 3) -> list[Datum]:
    """``n`` sampled replies of different lengths, with advantages of both signs."""

    async def go() -> list[Datum]:
        out = []
        for i in range(n):
            prompt = chat_prompt(backend, i)
            sample = await backend.sampler.sample(
                prompt, SamplingParams(max_tokens=3 + 4 * i, seed=i, temperature=0.9), session_id=f"s{i}"
            )
            out.append(make_datum(prompt, sample, advantage=1.5 if i % 2 else -0.7))
        return out

    return run(go())


@pytest.fixture
def saved_model_dir(tmp_path: Any) -> Any:
    """The tiny preset written as a Hugging Face model directory (a "real" model to the backend)."""
    source = LocalBackend(LocalBackendConfig(), seed=0)
    source.model.save_pretrained(tmp_path / "model")
    source.get_tokenizer().save_pretrained(tmp_path / "model")
    run(source.aclose())
    return tmp_path / "model"


def _grads(backend: LocalBackend) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in backend.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("loss_fn", "loss_config"),
    [
        ("ppo", {"entropy_coef": 0.1, "temperature": 0.9}),
        ("cispo", {"top_k": 5, "top_p": 0.8}),
        ("cross_entropy", None),
    ],
)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_logprobs_equal_the_whole_computation(
    make_backend: Any, loss_fn: str, loss_config: dict[str, float] | None, chunk: int
) -> None:
    """Same metrics, per-datum logprobs and gradients (the entropy bonus's included) chunk by chunk."""
    whole = make_backend(seed=4, train_logprob_chunk=0)
    chunked = make_backend(seed=4, train_logprob_chunk=chunk)
    datums = _datums(whole)
    a = run(whole.forward_backward(datums, loss_fn, loss_config))
    b = run(chunked.forward_backward(datums, loss_fn, loss_config))
    for key, value in a.metrics.items():
        assert b.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert y == pytest.approx(x, abs=1e-5)
    ga, gb = _grads(whole), _grads(chunked)
    assert ga.keys() == gb.keys() and ga
    for name, grad in ga.items():
        assert torch.allclose(grad, gb[name], atol=1e-6, rtol=1e-4), name


def test_chunked_scores_skip_padding_and_keep_no_logits_for_backward(make_backend: Any) -> None:
    """Padding positions are 0 as before, and the graph saves hidden states, not chunk logits."""
    backend = make_backend(seed=1)
    datums = _datums(backend)
    pad = backend.get_tokenizer().pad_token_id
    settings = parse_loss_config("ppo", None)
    vocab = len(backend.get_tokenizer())
    saved: list[torch.Size] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = trainer_logprobs_and_entropy(backend.model, datums, settings, pad, "cache", 4)
    with torch.no_grad():
        full, _ = trainer_logprobs_and_entropy(backend.model, datums, settings, pad, "cache", 0)
    assert torch.allclose(logp, full, atol=1e-5)
    for i, d in enumerate(datums):
        assert not logp[i, len(d.model_input) :].any()
    assert saved and not [s for s in saved if s and s[-1] == vocab]


def test_a_model_that_post_processes_its_logits_is_refused_or_followed() -> None:
    """Gemma 2's soft cap is applied chunk by chunk; a scale the split does not know is refused."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM

    small = {"vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8}
    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(Gemma2Config(**small, final_logit_softcapping=0.5)).eval()

    def forward_of(model: torch.nn.Module) -> Any:
        return lambda ids, mask, pos: model_forward(model, ids, mask, pos, cache_arg="cache")

    split = split_head(gemma)
    assert split.softcap == 0.5
    check_split(gemma, split, forward_of(gemma))
    granite = GraniteForCausalLM(GraniteConfig(**small, logits_scaling=8.0)).eval()
    with pytest.raises(ConfigError, match="train_logprob_chunk=0"):
        check_split(granite, split_head(granite), forward_of(granite))


def test_micro_batches_respect_the_token_budget_and_keep_order() -> None:
    def datum(n: int) -> Datum:
        return Datum(model_input=[1] * n, target_tokens=[1] * n, logprobs=[0.0] * n,
                     advantages=[0.0] * n, weights=[1.0] * n)

    lengths = [4, 4, 10, 2, 2, 2, 30, 1]
    datums = [datum(n) for n in lengths]
    ranges = micro_batches(datums, TrainShape(micro_batch=3, tokens_per_micro_batch=20))
    assert [list(r) for r in ranges] == [[0, 1], [2, 3], [4, 5], [6], [7]]
    for r in ranges:
        assert len(r) <= 3
        assert len(r) == 1 or len(r) * max(lengths[i] for i in r) <= 20
    assert [list(r) for r in micro_batches(datums, TrainShape(micro_batch=3))] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_token_budget_and_checkpointing_give_the_same_gradient(make_backend: Any) -> None:
    plain = make_backend(seed=6, train_tokens_per_micro_batch=0, train_logprob_chunk=0)
    lean = make_backend(seed=6, train_tokens_per_micro_batch=40, gradient_checkpointing=True)
    datums = _datums(plain, 4)
    assert max(len(d.model_input) for d in datums) <= 40  # each micro-batch holds at least one
    assert len(micro_batches(datums, TrainShape(tokens_per_micro_batch=40))) > 1
    a = run(plain.forward_backward(datums, "ppo"))
    b = run(lean.forward_backward(datums, "ppo"))
    assert b.metrics["loss"] == pytest.approx(a.metrics["loss"], rel=1e-5, abs=1e-7)
    ga, gb = _grads(plain), _grads(lean)
    for name, grad in ga.items():
        assert torch.allclose(grad, gb[name], atol=1e-6, rtol=1e-4), name
    layers = [m for m in lean.model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    assert layers and not any(m.training for m in lean.model.modules())  # restored after the step


def test_checkpointing_recomputes_layers(make_backend: Any) -> None:
    """With the setting on, each decoder layer runs again in the backward."""
    backend = make_backend(seed=0, gradient_checkpointing=True)
    datums = _datums(backend, 1)
    calls: list[int] = []
    layer = backend.model.model.layers[0]
    handle = layer.self_attn.register_forward_hook(lambda *_: calls.append(1))
    try:
        run(backend.forward_backward(datums, "ppo"))
    finally:
        handle.remove()
    assert len(calls) == 2


def test_checkpointing_is_refused_for_a_model_with_dropout(make_backend: Any) -> None:
    backend = make_backend(seed=0)
    backend.model.config.attention_dropout = 0.1
    with pytest.raises(ConfigError, match="attention_dropout"):
        enable_checkpointing(backend.model)


@pytest.mark.parametrize("key", ["train_micro_batch", "train_tokens_per_micro_batch", "train_logprob_chunk"])
def test_negative_sizes_are_refused(make_backend: Any, key: str) -> None:
    with pytest.raises(ConfigError, match=f"backend.{key}=-1 must be >= "):
        make_backend(**{key: -1})


def test_bf16_setting_runs_the_chunked_path_on_cpu(make_backend: Any) -> None:
    """bf16 weights: the chunked logprobs stay float32 and close to the whole computation's."""
    backend = make_backend(seed=2, dtype="bfloat16", gradient_checkpointing=True)
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    datums = _datums(backend, 2)
    out = run(backend.forward_backward(datums, "ppo", {"entropy_coef": 0.01}))
    assert all(p.grad is None or p.grad.dtype == torch.bfloat16 for p in backend.model.parameters())
    pad = backend.get_tokenizer().pad_token_id
    settings = parse_loss_config("ppo", None)
    with torch.no_grad():
        full, _ = trainer_logprobs_and_entropy(backend.model, datums, settings, pad, "cache", 0)
        chunked, _ = trainer_logprobs_and_entropy(backend.model, datums, settings, pad, "cache", 5)
    assert chunked.dtype == torch.float32
    assert torch.allclose(full, chunked, atol=2e-2)
    assert out.metrics["logprob_diff/max"] < 0.1  # bf16 rounding, sampler vs trainer


def test_a_real_model_with_the_tiny_learning_rate_is_warned_about(
    saved_model_dir: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Full fine-tuning at the tiny model's 1e-3 names the mode's starting rate; tiny and 1e-6 say nothing."""
    import logging

    from omegaconf import OmegaConf

    def build(model: str, rate: float) -> list[str]:
        caplog.clear()
        cfg = OmegaConf.create({"backend": {"model": model}, "algorithm": {"learning_rate": rate}, "seed": 0})
        with caplog.at_level(logging.WARNING, logger="tracerl_local.learning_rate"):
            backend = LocalBackend.from_config(cfg)
        run(backend.aclose())
        return [r.getMessage() for r in caplog.records]

    (message,) = build(str(saved_model_dir), 1e-3)
    assert "algorithm.learning_rate=0.001" in message and "algorithm.learning_rate=1e-06" in message
    assert build(str(saved_model_dir), 1e-6) == []
    assert build("tiny", 1e-3) == []
    assert learning_rate_advice("some/model", lora=True, learning_rate=1e-3) is not None
    assert learning_rate_advice("some/model", lora=True, learning_rate=5e-5) is None


def test_bf16_autocast_keeps_float32_weights_and_runs_in_bf16(make_backend: Any) -> None:
    """Mixed precision: float32 weights and gradients, a bf16 forward (logprobs move by bf16 rounding)."""
    exact = make_backend(seed=3, dtype="float32")
    mixed = make_backend(seed=3, dtype="float32", train_bf16_autocast=True)
    datums = _datums(exact, 2)
    a = run(exact.forward_backward(datums, "ppo"))
    b = run(mixed.forward_backward(datums, "ppo"))
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    grads = _grads(mixed)
    assert grads and all(g.dtype == torch.float32 and g.isfinite().all() for g in grads.values())
    gap = max(abs(x - y) for la, lb in zip(a.logprobs, b.logprobs, strict=True) for x, y in zip(la, lb, strict=True))
    assert 0 < gap < 0.1, gap

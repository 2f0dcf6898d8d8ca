"""The CUDA path: ``device=auto`` picks the GPU and ``dtype=auto`` bf16; logprobs still agree."""

from __future__ import annotations

import asyncio

import pytest
import torch
from local_helpers import chat_prompt, make_datum, run

from core.types import AdamParams, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_bf16_sample_train_sync(make_backend) -> None:
    backend = make_backend(seed=0)
    assert next(backend.model.parameters()).device.type == "cuda"
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    prompts = [chat_prompt(backend, n) for n in range(8)]

    async def go() -> float:
        results = await asyncio.gather(
            *(
                backend.sampler.sample(p, SamplingParams(max_tokens=8), session_id=f"s{i}")
                for i, p in enumerate(prompts)
            )
        )
        datums = [make_datum(p, r, 1.0) for p, r in zip(prompts, results, strict=True)]
        out = await backend.forward_backward(datums, "ppo")
        await backend.optim_step(AdamParams(learning_rate=1e-3, grad_clip_norm=1.0))
        await backend.sync_sampler()
        again = await backend.sampler.sample(
            prompts[0], SamplingParams(max_tokens=4), session_id="x"
        )
        assert again.weight_version == 1
        return out.metrics["logprob_diff/max"]

    diff = run(go())
    print(f"bf16 largest |sampler - trainer| logprob difference: {diff:.3g}")
    assert diff < 0.1  # bf16: batch shape changes the rounding


def test_cuda_memory_settings_match_the_plain_computation(make_backend) -> None:
    """Chunked logprobs, gradient checkpointing and bf16 autocast on the GPU: the same
    logprobs as the whole-batch computation within bf16 rounding, finite float32 gradients."""
    plain = make_backend(seed=0, dtype="float32", train_logprob_chunk=0)
    lean = make_backend(
        seed=0, dtype="float32", train_logprob_chunk=7, gradient_checkpointing=True, train_bf16_autocast=True
    )
    prompts = [chat_prompt(plain, n) for n in range(4)]

    async def go() -> tuple[list[list[float]], list[list[float]]]:
        results = [
            await plain.sampler.sample(p, SamplingParams(max_tokens=8, seed=i), session_id=f"s{i}")
            for i, p in enumerate(prompts)
        ]
        datums = [make_datum(p, r, 1.0) for p, r in zip(prompts, results, strict=True)]
        a = await plain.forward_backward(datums, "ppo")
        b = await lean.forward_backward(datums, "ppo")
        return a.logprobs, b.logprobs

    a, b = run(go())
    gap = max(abs(x - y) for la, lb in zip(a, b, strict=True) for x, y in zip(la, lb, strict=True))
    print(f"float32 vs chunked + checkpointed + bf16 autocast, largest logprob difference: {gap:.3g}")
    assert gap < 0.1
    grads = [p.grad for p in lean.model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and bool(g.isfinite().all()) for g in grads)

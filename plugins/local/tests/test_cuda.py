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

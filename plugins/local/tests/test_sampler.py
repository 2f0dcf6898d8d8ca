"""The local sampler: logprob agreement with the trainer, batching, stopping, seeds, weights."""

from __future__ import annotations

import asyncio

import pytest
from local_helpers import chat_prompt, make_datum, run
from tracerl_local.backend import LocalBackend

from core.errors import ContextLengthError, SamplerError
from core.types import FinishReason, SamplingParams


@pytest.mark.parametrize(
    ("params", "loss_config"),
    [
        (SamplingParams(max_tokens=12), {}),
        (SamplingParams(max_tokens=12, temperature=0.7), {"temperature": 0.7}),
        (
            SamplingParams(max_tokens=12, temperature=1.3, top_k=20, top_p=0.9),
            {"temperature": 1.3, "top_k": 20, "top_p": 0.9},
        ),
    ],
    ids=["t1", "t0.7", "t1.3-topk-topp"],
)
def test_sampler_and_trainer_logprobs_agree(make_backend, params, loss_config) -> None:
    backend: LocalBackend = make_backend(seed=1)
    prompts = [chat_prompt(backend, n) for n in range(6)]
    prompts[1] = prompts[1][3:]  # different lengths: exercises left padding + positions

    async def go() -> float:
        results = await asyncio.gather(
            *(backend.sampler.sample(p, params, session_id=f"s{i}") for i, p in enumerate(prompts))
        )
        datums = [make_datum(p, r, advantage=1.0) for p, r in zip(prompts, results, strict=True)]
        out = await backend.forward_backward(datums, "importance_sampling", loss_config)
        # per-datum trainer logprobs line up with the sampler's, token by token
        for p, r, lp in zip(prompts, results, out.logprobs, strict=True):
            trainer = lp[len(p) - 1 :]
            assert trainer == pytest.approx(r.logprobs, abs=1e-4)
        return out.metrics["logprob_diff/max"]

    diff = run(go())
    print(f"largest |sampler - trainer| logprob difference: {diff:.3g}")
    assert diff < 1e-4


def test_mismatched_temperature_shows_in_logprob_diff(make_backend) -> None:
    """The health metric catches a sampling/training temperature mismatch."""
    backend = make_backend(seed=1)
    prompt = chat_prompt(backend)

    async def go() -> float:
        r = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=8, temperature=0.5), session_id="s"
        )
        out = await backend.forward_backward([make_datum(prompt, r)], "cross_entropy")
        return out.metrics["logprob_diff/max"]

    assert run(go()) > 0.1


def test_concurrent_requests_are_batched(make_backend) -> None:
    backend = make_backend(batch_wait_ms=20.0)
    prompt = chat_prompt(backend)
    n, max_tokens = 12, 6

    async def go() -> list:
        return await asyncio.gather(
            *(
                backend.sampler.sample(
                    prompt, SamplingParams(max_tokens=max_tokens, seed=i), session_id=f"s{i}"
                )
                for i in range(n)
            )
        )

    results = run(go())
    stats = backend.sampler.stats
    assert len(results) == n and stats.requests == n
    assert stats.batches == 1 and stats.largest_batch == n
    # one prefill + at most max_tokens-1 decode steps for the whole batch, not per request
    assert stats.forward_calls <= max_tokens
    assert all(r.weight_version == 0 for r in results)


def test_stop_conditions_and_finish_reasons(make_backend) -> None:
    backend = make_backend(seed=2)
    tok = backend.get_tokenizer()
    prompt = chat_prompt(backend)

    async def go() -> None:
        free = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=20, temperature=0), session_id="a"
        )
        assert free.finish_reason is FinishReason.LENGTH or free.token_ids[-1] == tok.eos_token_id
        if free.finish_reason is FinishReason.LENGTH:
            assert len(free.token_ids) == 20
        # stop token id: the greedy continuation's 3rd token ends generation there
        third = free.token_ids[2]
        first_hit = free.token_ids.index(third)
        by_id = await backend.sampler.sample(
            prompt,
            SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(third,)),
            session_id="b",
        )
        assert by_id.token_ids == free.token_ids[: first_hit + 1]
        assert by_id.finish_reason is FinishReason.STOP
        # stop string: text of tokens 2..3 of the greedy continuation
        text = tok.decode(free.token_ids[:4])
        stop = text[-2:]
        by_str = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=20, temperature=0, stop=(stop,)), session_id="c"
        )
        assert by_str.finish_reason is FinishReason.STOP
        assert stop in tok.decode(by_str.token_ids)
        assert stop not in tok.decode(by_str.token_ids[:-1])
        assert by_str.token_ids == free.token_ids[: len(by_str.token_ids)]
        short = await backend.sampler.sample(prompt, SamplingParams(max_tokens=1), session_id="d")
        assert len(short.token_ids) == 1

    run(go())


def test_eos_always_stops(make_backend) -> None:
    backend = make_backend(seed=0)
    eos = backend.get_tokenizer().eos_token_id
    prompt = chat_prompt(backend)
    # Make EOS overwhelmingly likely by biasing the served model's output layer.
    import torch

    with torch.no_grad():
        backend.sampler.model.lm_head.weight[eos] += 5.0  # tied: embeddings move too; fine here

    async def go() -> None:
        r = await backend.sampler.sample(prompt, SamplingParams(max_tokens=30), session_id="s")
        assert r.token_ids.count(eos) == 1 and r.token_ids[-1] == eos
        assert r.finish_reason is FinishReason.STOP

    run(go())


def test_seeds_reproduce_and_differ(make_backend) -> None:
    backend = make_backend(seed=0)
    prompt = chat_prompt(backend)
    params = SamplingParams(max_tokens=10, seed=123)

    async def go() -> None:
        a = await backend.sampler.sample(prompt, params, session_id="a")
        b, c, d = await asyncio.gather(
            backend.sampler.sample(prompt, params, session_id="b"),
            backend.sampler.sample(prompt, SamplingParams(max_tokens=10, seed=7), session_id="c"),
            backend.sampler.sample(prompt[2:], SamplingParams(max_tokens=10), session_id="d"),
        )
        assert a.token_ids == b.token_ids  # same seed, alone or inside a batch
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert c.token_ids != a.token_ids

    run(go())


def test_in_flight_batch_keeps_old_weights(make_backend) -> None:
    """With on_update=finish, a batch running during sync_sampler finishes on (and reports)
    the old weights (the default, continue, is tested in test_interrupt.py)."""
    import torch

    backend = make_backend(seed=0, batch_wait_ms=0.0, on_update="finish")
    prompt = chat_prompt(backend)
    greedy = SamplingParams(max_tokens=200, temperature=0)

    async def go() -> None:
        before = await backend.sampler.sample(prompt, greedy, session_id="ref")
        assert before.finish_reason is FinishReason.LENGTH  # seed 0: greedy never emits EOS
        while backend.sampler._current.active:  # wait until its batch released the snapshot
            await asyncio.sleep(0.001)
        served = backend.sampler.model
        long = asyncio.create_task(backend.sampler.sample(prompt, greedy, session_id="l"))
        while not backend.sampler._current.active:
            await asyncio.sleep(0.001)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():  # change the trained weights a lot, then publish mid-generation
            for p in backend.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
        await backend.sync_sampler()
        assert backend.weight_version == 1
        assert backend.sampler.model is not served  # busy snapshot: a fresh copy was made
        old = await long
        new = await backend.sampler.sample(prompt, greedy, session_id="n")
        assert old.weight_version == 0 and new.weight_version == 1
        assert old.token_ids == before.token_ids  # finished on the old weights throughout
        assert new.token_ids != before.token_ids
        # with no batch running, the next sync copies in place into the served model
        while backend.sampler._current.active:
            await asyncio.sleep(0.001)
        served = backend.sampler.model
        await backend.sync_sampler()
        assert backend.sampler.model is served and backend.sampler.weight_version == 2

    run(go())


def test_the_tiny_context_holds_the_gateways_whole_budget() -> None:
    """An agent's tool loop (a tools block alone is hundreds of tokens) fits the tiny preset
    as far as the gateway lets a conversation grow: 512 positions failed the first call."""
    from tracerl_local.config import TinyModelConfig

    from core.gateway import GatewayConfig

    assert TinyModelConfig().max_position_embeddings >= GatewayConfig().max_context_tokens


def test_bad_prompts_raise_sampler_error(make_backend) -> None:
    backend = make_backend(
        tiny=__import__("tracerl_local.config").config.TinyModelConfig(max_position_embeddings=32)
    )
    prompt = chat_prompt(backend)

    async def go() -> None:
        with pytest.raises(SamplerError, match="empty"):
            await backend.sampler.sample([], SamplingParams(), session_id="s")
        with pytest.raises(ContextLengthError, match=r"context_length_exceeded.*\(backend\.tiny\.max_position_embeddings\)"):
            await backend.sampler.sample(prompt * 2, SamplingParams(), session_id="s")
        with pytest.raises(SamplerError, match="outside the vocabulary"):
            await backend.sampler.sample([10**6], SamplingParams(), session_id="s")
        # a prompt near the context end stops with "length" at the context limit
        r = await backend.sampler.sample(
            prompt + prompt[:8], SamplingParams(max_tokens=50), session_id="s"
        )
        assert len(prompt) + 8 + len(r.token_ids) <= 32
        await backend.aclose()
        with pytest.raises(SamplerError, match="closed"):
            await backend.sampler.sample(prompt, SamplingParams(), session_id="s")

    run(go())

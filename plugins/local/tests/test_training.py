"""Training primitives of the local backend: aggregation, learning direction, rebinding, state."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from local_helpers import chat_prompt, make_datum, run
from omegaconf import OmegaConf
from tracerl_local.backend import LocalBackend
from tracerl_local.losses import parse_loss_config
from tracerl_local.training import trainer_logprobs, trainer_logprobs_and_entropy

from core.errors import ConfigError, TrainingError
from core.types import AdamParams, Datum, SamplingParams


def _logprobs_now(backend: LocalBackend, datum: Datum) -> list[float]:
    settings = parse_loss_config("cross_entropy", None)
    with torch.no_grad():
        lp = trainer_logprobs(
            backend.model, [datum], settings, backend.get_tokenizer().pad_token_id, "cache"
        )
    return lp[0, : len(datum.model_input)].tolist()


def _trained_sum(backend: LocalBackend, datum: Datum) -> float:
    lp = _logprobs_now(backend, datum)
    return sum(x for x, w in zip(lp, datum.weights, strict=True) if w > 0)


def test_loss_is_token_level_mean_over_the_batch(make_backend) -> None:
    """loss = sum(w * per-token loss) / sum(w) over all datums, independent of micro-batching."""
    whole, micro = make_backend(seed=3), make_backend(seed=3, train_micro_batch=1)
    prompts = [chat_prompt(whole, n) for n in range(3)]

    async def go() -> None:
        samples = [
            await whole.sampler.sample(
                p, SamplingParams(max_tokens=3 + 2 * i, seed=i), session_id=f"s{i}"
            )
            for i, p in enumerate(prompts)
        ]
        advs = [1.5, -0.5, 2.0]
        datums = [make_datum(p, s, a) for p, s, a in zip(prompts, samples, advs, strict=True)]
        a = await whole.forward_backward(datums, "importance_sampling")
        b = await micro.forward_backward(datums, "importance_sampling")
        num = den = 0.0
        for d, lp in zip(datums, a.logprobs, strict=True):
            for t, w in enumerate(d.weights):
                num += w * -math.exp(lp[t] - d.logprobs[t]) * d.advantages[t]
                den += w
        assert a.metrics["loss"] == pytest.approx(num / den, rel=1e-5)
        assert a.metrics["num_tokens"] == den
        assert b.metrics["loss"] == pytest.approx(a.metrics["loss"], rel=1e-5)
        for p, q in zip(whole.model.parameters(), micro.model.parameters(), strict=True):
            assert torch.allclose(p.grad, q.grad, atol=1e-6)

    run(go())


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_sampled_logprob(make_backend, loss_fn: str, sign: float) -> None:
    backend = make_backend(seed=5)
    prompt = chat_prompt(backend)

    async def go() -> tuple[float, float]:
        sample = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=6, seed=1), session_id="s"
        )
        datum = make_datum(prompt, sample, advantage=sign)
        before = _trained_sum(backend, datum)
        await backend.forward_backward([datum], loss_fn)
        await backend.optim_step(AdamParams(learning_rate=1e-2))
        return before, _trained_sum(backend, datum)

    before, after = run(go())
    assert (after - before) * sign > 0.05, (before, after)


def test_cross_entropy_steps_change_what_the_sampler_produces(make_backend) -> None:
    backend = make_backend(seed=0)
    tok = backend.get_tokenizer()
    prompt = chat_prompt(backend, 3)
    target = tok.encode("4", add_special_tokens=False) + [tok.eos_token_id]
    ids = prompt + target
    datum = Datum(
        model_input=ids[:-1],
        target_tokens=ids[1:],
        logprobs=[0.0] * (len(ids) - 1),
        advantages=[0.0] * (len(ids) - 1),
        weights=[0.0] * (len(prompt) - 1) + [1.0] * len(target),
    )

    async def go() -> None:
        greedy = SamplingParams(max_tokens=8, temperature=0)
        first = await backend.sampler.sample(prompt, greedy, session_id="s")
        assert first.token_ids != target and first.weight_version == 0
        for _ in range(40):
            await backend.forward_backward([datum], "cross_entropy")
            await backend.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=1.0))
        stale = await backend.sampler.sample(prompt, greedy, session_id="s")
        assert stale.token_ids == first.token_ids  # no rebind yet: old weights
        await backend.sync_sampler()
        learned = await backend.sampler.sample(prompt, greedy, session_id="s")
        assert learned.token_ids == target and learned.weight_version == 1
        sampled = await asyncio.gather(
            *(
                backend.sampler.sample(
                    prompt, SamplingParams(max_tokens=8, seed=i), session_id=f"t{i}"
                )
                for i in range(16)
            )
        )
        assert sum(s.token_ids == target for s in sampled) >= 14

    run(go())


def test_optim_step_clips_and_reports_grad_norm(make_backend) -> None:
    backend = make_backend(seed=0)
    prompt = chat_prompt(backend)

    async def go() -> None:
        s = await backend.sampler.sample(prompt, SamplingParams(max_tokens=4), session_id="s")
        await backend.forward_backward([make_datum(prompt, s, 50.0)], "importance_sampling")
        norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in backend.model.parameters()))
        out = await backend.optim_step(AdamParams(learning_rate=1e-3, grad_clip_norm=0.5))
        assert out["grad_norm"] == pytest.approx(norm, rel=1e-4) and norm > 0.5
        assert all(p.grad is None for p in backend.model.parameters())  # cleared

    run(go())


def test_save_load_round_trip(make_backend, tmp_path: Path) -> None:
    a, b = make_backend(seed=0), make_backend(seed=9)
    prompt = chat_prompt(a)

    async def go() -> None:
        s = await a.sampler.sample(prompt, SamplingParams(max_tokens=6, seed=0), session_id="s")
        datum = make_datum(prompt, s, 1.0)
        for _ in range(2):
            await a.forward_backward([datum], "ppo")
            await a.optim_step(AdamParams(learning_rate=1e-2))
            await a.sync_sampler()
        where = await a.save_state(str(tmp_path / "ckpt"))
        await b.load_state(where)
        assert b.weight_version == a.weight_version == 2
        for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True):
            assert torch.equal(p, q)
        greedy = SamplingParams(max_tokens=8, temperature=0)
        ra = await a.sampler.sample(prompt, greedy, session_id="x")
        rb = await b.sampler.sample(prompt, greedy, session_id="x")
        assert ra.token_ids == rb.token_ids and rb.weight_version == 2
        # the optimizer state came back too: one more identical step stays identical
        for backend in (a, b):
            await backend.forward_backward([datum], "ppo")
            await backend.optim_step(AdamParams(learning_rate=1e-2))
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-6)
        with pytest.raises(TrainingError, match="no local-backend checkpoint"):
            await b.load_state(str(tmp_path / "missing"))

    run(go())


def test_from_config_is_deterministic_in_the_seed() -> None:
    def build(seed: int) -> LocalBackend:
        cfg = OmegaConf.create(
            {"seed": seed, "backend": {"name": "local", "model": "tiny", "num_threads": 2}}
        )
        return LocalBackend.from_config(cfg)

    a, b, c = build(4), build(4), build(5)
    try:
        pa, pb, pc = (next(x.model.parameters()) for x in (a, b, c))
        assert torch.equal(pa, pb) and not torch.equal(pa, pc)
        assert a.model_id() == "tiny" and a.weight_version == 0
        assert a.model.config.vocab_size == len(a.get_tokenizer())
        assert torch.get_num_threads() == 2
    finally:
        for x in (a, b, c):
            run(x.aclose())


def test_bad_datums_and_configs_are_refused(make_backend) -> None:
    backend = make_backend(seed=0)
    good = Datum([1, 2], [2, 3], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0])
    bad_token = Datum([1, 2], [2, 10**6], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0])

    async def go() -> None:
        with pytest.raises(ConfigError, match="no datums"):
            await backend.forward_backward([], "cross_entropy")
        with pytest.raises(ConfigError, match="outside the vocabulary"):
            await backend.forward_backward([good, bad_token], "cross_entropy")
        with pytest.raises(ConfigError, match="clip_hi"):
            await backend.forward_backward([good], "ppo", {"clip_hi": 0.3})

    run(go())
    with pytest.raises(ConfigError, match="backend.dtype='fp8'"):
        make_backend(dtype="fp8")
    with pytest.raises(ConfigError, match="backend.device='tpu'"):
        make_backend(device="tpu")


def test_entropy_bonus_raises_entropy_and_is_reported(make_backend) -> None:
    """With zero advantages only ``entropy_coef`` moves the weights, towards a flatter
    distribution; the reported entropy is that of the sampling distribution."""
    backend = make_backend(seed=2)
    prompt = chat_prompt(backend)

    async def go() -> None:
        sample = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=6, seed=0), session_id="s"
        )
        datum = make_datum(prompt, sample, advantage=0.0)
        plain = await backend.forward_backward([datum], "ppo")
        assert all(p.grad is None or not p.grad.any() for p in backend.model.parameters())
        # by hand: mean entropy of the trained positions' distributions
        settings = parse_loss_config("ppo", None)
        with torch.no_grad():
            _, entropy = trainer_logprobs_and_entropy(
                backend.model, [datum], settings, backend.get_tokenizer().pad_token_id, "cache"
            )
        weights = torch.tensor(datum.weights)
        expected = float((entropy[0, : len(weights)] * weights).sum() / weights.sum())
        assert plain.metrics["entropy"] == pytest.approx(expected, rel=1e-5)
        assert plain.metrics["loss"] == pytest.approx(0.0, abs=1e-7)
        before = expected
        for _ in range(5):
            out = await backend.forward_backward([datum], "ppo", {"entropy_coef": 0.5})
            assert out.metrics["loss"] == pytest.approx(-0.5 * out.metrics["entropy"], rel=1e-5)
            await backend.optim_step(AdamParams(learning_rate=1e-2))
        after = (await backend.forward_backward([datum], "ppo")).metrics["entropy"]
        assert after > before + 1e-3, (before, after)

    run(go())


def test_entropy_keeps_no_graph_unless_it_is_trained(make_backend) -> None:
    """As a metric the entropy must not hold vocabulary-sized tensors in the autograd graph."""
    backend = make_backend(seed=2)
    prompt = chat_prompt(backend)

    async def go() -> None:
        sample = await backend.sampler.sample(
            prompt, SamplingParams(max_tokens=4, seed=0), session_id="s"
        )
        datum = make_datum(prompt, sample, advantage=1.0)
        pad = backend.get_tokenizer().pad_token_id
        for coef, graph in ((0.0, False), (0.1, True)):
            settings = parse_loss_config("ppo", {"entropy_coef": coef})
            logp, entropy = trainer_logprobs_and_entropy(backend.model, [datum], settings, pad, "cache")
            assert logp.requires_grad and entropy.requires_grad is graph, coef

    run(go())


def test_entropy_coef_must_be_non_negative() -> None:
    with pytest.raises(ConfigError, match="entropy_coef=-0.1 must be >= 0"):
        parse_loss_config("ppo", {"entropy_coef": -0.1})
    assert parse_loss_config("cross_entropy", {"entropy_coef": 0.01}).entropy_coef == 0.01

"""The shared logits-to-distribution step: temperature, top-k, top-p, greedy, CDF sampling."""

from __future__ import annotations

import math

import torch
from tracerl_local.logits import processed_logprobs, sample_tokens


def _lp(logits: list[float], t: float = 1.0, k: int = -1, p: float = 1.0) -> torch.Tensor:
    return processed_logprobs(
        torch.tensor([logits]), torch.tensor([t]), torch.tensor([k]), torch.tensor([p])
    )[0]


def test_temperature_scales_before_softmax() -> None:
    logits = [2.0, 1.0, 0.0]
    got = _lp(logits, t=0.5)
    z = sum(math.exp(x / 0.5) for x in logits)
    want = [x / 0.5 - math.log(z) for x in logits]
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_top_k_keeps_k_tokens_renormalised() -> None:
    got = _lp([3.0, 2.0, 1.0, 0.0], k=2).exp()
    z = math.exp(3) + math.exp(2)
    assert torch.allclose(
        got, torch.tensor([math.exp(3) / z, math.exp(2) / z, 0.0, 0.0]), atol=1e-6
    )


def test_top_p_keeps_smallest_set_reaching_mass() -> None:
    # probs 0.5, 0.3, 0.2 -> top_p 0.7 keeps the first two (0.5 < 0.7, 0.8 >= 0.7).
    logits = [math.log(0.5), math.log(0.3), math.log(0.2)]
    got = _lp(logits, p=0.7).exp()
    assert torch.allclose(got, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0]), atol=1e-6)
    # a tiny top_p always keeps the most likely token
    assert torch.allclose(_lp(logits, p=0.01).exp(), torch.tensor([1.0, 0.0, 0.0]), atol=1e-6)


def test_greedy_reports_temperature_one_logprob_and_argmax() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    lp = processed_logprobs(logits, torch.tensor([0.0]), torch.tensor([1]), torch.tensor([0.1]))
    assert torch.allclose(lp, torch.log_softmax(logits, -1))  # truncation ignored when greedy
    tok = sample_tokens(lp, logits, torch.tensor([True]), torch.tensor([0.0]))
    assert tok.tolist() == [1]


def test_cdf_sampling_follows_probabilities_and_skips_masked() -> None:
    lp = _lp(
        [math.log(0.25), math.log(0.75), 5.0], k=2
    )  # token 2 is the top one; k=2 keeps 2 and 1
    lp = lp.expand(4, -1)
    u = torch.tensor([0.0, 0.2, 0.9, 0.9999])
    toks = sample_tokens(lp, torch.zeros(4, 3), torch.zeros(4, dtype=torch.bool), u).tolist()
    # token 0 (masked) is never drawn; CDF order is token 1 then token 2
    assert 0 not in toks
    p1 = float(lp[0, 1].exp())
    assert toks == [1 if x < p1 else 2 for x in u.tolist()]

"""Turns sampled from another distribution than the loss assumes are not trained as on-policy.

A session that allows sampling overrides (``GatewayConfig.allow_sampling_overrides``
or the per-session flag) lets an agent set its own temperature, top-p or top-k.
The logprobs such a turn recorded are those of that distribution, while the
trainer scores the tokens at the loss's settings (``algorithm.temperature``,
``loss_config.top_p``/``top_k``): the importance ratio between them measures the
difference of settings, not of weights. Such a turn becomes context (loss
weight 0): it conditions the later turns, is counted, and is never trained.

Defines:

- ``LossSampling``: the sampling settings the loss assumes; ``loss_sampling`` reads them
  from the ``algorithm`` node (the loop's sessions sample with them too).
- ``mask_override_turns``: outcomes with every turn sampled otherwise made context
  (compared per policy in a run whose policies sample apart), plus how many turns and
  tokens that was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.rollout import RolloutOutcome

__all__ = ["LossSampling", "loss_sampling", "mask_override_turns"]


@dataclass(frozen=True)
class LossSampling:
    """The distribution the loss scores tokens under."""

    temperature: float = 1.0
    """``algorithm.temperature`` (the loss's ``temperature``)."""
    top_p: float = 1.0
    """``loss_config.top_p`` (1: no nucleus truncation)."""
    top_k: int = -1
    """``loss_config.top_k`` (-1 or 0: no top-k truncation)."""

    def matches(self, params: Any) -> bool:
        """True when a turn sampled with ``params`` (``SamplingParams`` or its dict, as
        traces store it) drew from this distribution; unknown params count as matching."""
        get = params.get if isinstance(params, Mapping) else lambda k, d=None: getattr(params, k, d)
        temperature, top_p, top_k = get("temperature", None), get("top_p", None), get("top_k", None)
        if temperature is None or top_p is None or top_k is None:
            return True  # recorded without its settings: the session's, which the loop set
        return (
            float(temperature) == self.temperature
            and float(top_p) == self.top_p
            and max(int(top_k), 0) == max(self.top_k, 0)
        )


def loss_sampling(algo: Any) -> LossSampling:
    """The settings ``algorithm`` makes the loss score tokens under."""
    given = dict(algo.loss_config or {})
    top_k = int(given.get("top_k", -1))
    return LossSampling(
        temperature=float(given.get("temperature", algo.temperature)),
        top_p=float(given.get("top_p", 1.0)),
        top_k=top_k if top_k > 0 else -1,
    )


def mask_override_turns(
    outcomes: Sequence[RolloutOutcome], loss: LossSampling | Mapping[str, LossSampling]
) -> tuple[list[RolloutOutcome], int, int]:
    """``outcomes`` with every turn sampled at other settings than ``loss`` made context.

    ``loss`` may be given per policy (each policy's loss assumes its own settings,
    docs/multi_agent.md): a row is compared with its policy's (the first's for a policy
    not given).

    A row's turns and its ``turn_params`` metadata are in the same order (the
    gateway writes both). Masked tokens get ``loss_mask`` 0 in copies of the rows;
    the rollout, its reward and its group's advantage stay.

    Returns:
        The outcomes, the turns masked and the tokens masked.
    """
    out: list[RolloutOutcome] = []
    turns = tokens = 0
    by_policy = loss if isinstance(loss, Mapping) else {}
    first = next(iter(by_policy.values())) if by_policy else loss
    assert isinstance(first, LossSampling)
    for o in outcomes:
        rows = []
        for r in o.rows:
            params = r.metadata.get("turn_params") or []
            mine = by_policy.get(r.policy(), first) if by_policy else first
            other = [t for t, p in zip(r.turns, params, strict=False) if not mine.matches(p)]
            if not other:
                rows.append(r)
                continue
            mask = list(r.loss_mask)
            for t in other:
                n = sum(mask[t.start : t.end])
                if n:
                    turns, tokens = turns + 1, tokens + n
                mask[t.start : t.end] = [0] * (t.end - t.start)
            rows.append(replace(r, loss_mask=mask))
        out.append(replace(o, rows=rows) if rows != o.rows else o)
    return out, turns, tokens

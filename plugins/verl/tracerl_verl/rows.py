"""Gateway trace rows -> verl ``AgentLoopOutput`` objects.

Defines ``VerlRow`` (one row split at verl's prompt/response boundary),
``split_row``, ``order_rows``, ``to_agent_loop_outputs`` and ``batch_parse_metrics``.

Rules (documented in docs/backends/verl.md):

- Order: verl scores ``outputs[-1]`` and broadcasts its reward to the
  siblings, and computes teacher logprobs only for it, so the row with the
  most trained tokens goes last (ties keep the gateway's order).
- Split: ``prompt_ids`` are the row's tokens before its first generated
  token, ``response_ids`` the rest, with ``response_mask`` = the loss mask
  and ``response_logprobs`` the sampler's logprobs (0.0 on mask-0 tokens).
  A prompt longer than ``prompt_length`` is not cut (that would change what
  the model read): its overflow moves to the front of the response, masked
  out. A response longer than ``response_length`` is cut at the end (the
  kept tokens read exactly what they read before) and counted.
- Every row carries ``min_global_steps``/``max_global_steps`` (verl's v1
  trainer reads them as ints) and ``reward_extra_info`` (read by bracket), and
  ``tracerl_parse``: how many of the turns it trains ended in each tool-call parse
  status (``core.gateway.parse_watch.row_parse_counts``), which the ``tracerl_sync``
  trainer sums into the step's ``gateway/*`` metrics (``batch_parse_metrics``).
- A row whose kept response trains nothing is dropped; verl's rollout
  correction needs at least one trained token per row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.gateway.parse_watch import metrics_from_counts, row_parse_counts
from core.types import TraceRecord


@dataclass
class VerlRow:
    """One trace row in verl's prompt/response shape."""

    prompt_ids: list[int]
    """Tokens before the response (at most ``prompt_length``)."""
    response_ids: list[int]
    """Everything after: generated turns, tool output, overflowed prompt."""
    response_mask: list[int]
    """1 on tokens the model generated in this row."""
    response_logprobs: list[float]
    """Sampler logprob per response token (0.0 where the mask is 0)."""
    truncated: bool = False
    """True when tokens past ``response_length`` were dropped."""
    turns: int = 0
    """Generated turns in the row."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Row metadata from the gateway (counters)."""
    parse: dict[str, int] = field(default_factory=dict)
    """Turns this row trains by tool-call parse status (``row_parse_counts``)."""

    @property
    def trained_tokens(self) -> int:
        return sum(self.response_mask)


def split_row(row: TraceRecord, *, prompt_length: int, response_length: int) -> VerlRow:
    """Split ``row`` at verl's boundary (see the module docstring)."""
    row.validate()
    cut = min(row.prompt_length, prompt_length)
    end = min(len(row.token_ids), cut + response_length)
    return VerlRow(
        prompt_ids=list(row.token_ids[:cut]),
        response_ids=list(row.token_ids[cut:end]),
        response_mask=list(row.loss_mask[cut:end]),
        response_logprobs=[float(x) for x in row.logprobs[cut:end]],
        truncated=end < len(row.token_ids),
        turns=len(row.turns),
        extra=dict(row.metadata),
        parse=row_parse_counts(row),
    )


def order_rows(rows: Sequence[VerlRow]) -> list[VerlRow]:
    """Rows that train something, the most-trained last (stable for ties)."""
    kept = [r for r in rows if r.trained_tokens > 0]
    return sorted(kept, key=lambda r: r.trained_tokens)


def to_agent_loop_outputs(
    rows: Sequence[VerlRow],
    *,
    reward: float,
    min_global_steps: int,
    max_global_steps: int,
    with_logprobs: bool,
    metrics: dict[str, float] | None = None,
    reward_extra_info: dict[str, Any] | None = None,
) -> list[Any]:
    """verl ``AgentLoopOutput`` objects for ``rows`` (already ordered), all scored ``reward``.

    Args:
        rows: Output of ``order_rows``; must not be empty.
        reward: The rollout's reward, set on every row (verl would broadcast the last one's).
        min_global_steps: Oldest weight version any turn used.
        max_global_steps: Newest weight version any turn used.
        with_logprobs: Attach ``response_logprobs`` (False when the server returned none,
            so verl recomputes them instead of trusting zeros).
        metrics: ``AgentLoopMetrics`` fields (``generate_sequences``, ``tool_calls``).
        reward_extra_info: Per-trajectory values verl logs next to the reward.
    """
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    if not rows:
        raise ValueError("to_agent_loop_outputs needs at least one row")
    info = dict(reward_extra_info or {})
    outputs = []
    for row in rows:
        outputs.append(
            AgentLoopOutput(
                prompt_ids=row.prompt_ids,
                response_ids=row.response_ids,
                response_mask=row.response_mask,
                response_logprobs=row.response_logprobs if with_logprobs else None,
                reward_score=float(reward),
                num_turns=2 * row.turns + 1,
                metrics=AgentLoopMetrics(**(metrics or {})),
                extra_fields={
                    "min_global_steps": int(min_global_steps),
                    "max_global_steps": int(max_global_steps),
                    "reward_extra_info": dict(info),
                    "tracerl_truncated": int(row.truncated),
                    "tracerl_parse": dict(row.parse),
                },
            )
        )
    return outputs


def batch_parse_metrics(parse: Iterable[Any]) -> dict[str, float]:
    """The ``gateway/*`` parse metrics of a batch from its rows' ``tracerl_parse`` entries (None
    for rows of other agent loops); {} when no row has one."""
    counts: Counter[str] = Counter()
    seen = False
    for entry in parse:
        if isinstance(entry, dict):
            seen = True
            counts.update({str(k): int(v) for k, v in entry.items()})
    return metrics_from_counts(counts) if seen else {}

"""Gateway trace rows -> slime ``Sample`` objects.

Defines ``rows_to_samples`` and ``failed_sample``.

Rules (documented in docs/backends/slime.md):

- One ``Sample`` per trace row that trains at least one token, each a copy
  of slime's input sample (``group_index``, ``index``, ``prompt``, ``label``,
  ``metadata``, ``session_id`` kept), in the gateway's row order.
- Every sibling gets the same integer ``rollout_id`` (the input sample's own
  ``rollout_id``, else its ``index``): slime's loss reducer and step splitter
  count a rollout once through it, and our reward post-processor dedupes on it.
- ``tokens`` is the row as the model read and wrote it; the response starts
  at the row's first generated token (``response_length = len(tokens) -
  prompt_length``); ``loss_mask`` and ``rollout_log_probs`` are the row's
  mask and logprobs from there on (0 / 0.0 on tool and template tokens).
- ``status`` is TRUNCATED when the row's last turn stopped on length, else
  COMPLETED; ``reward`` is the rollout's reward, set here so slime skips
  its own reward model.
- ``metadata["tracerl"]`` holds the row's counters, ``parse`` among them: how many of the
  turns it trains ended in each tool-call parse status (``row_parse_counts``).
- A failed rollout is *one* ABORTED sample with ``remove_sample=True`` and
  a zero loss mask (``failed_sample``): slime drops its tokens from the
  loss, and ``tracerl_slime.rewards`` keeps it out of the group baseline.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from core.gateway.parse_watch import row_parse_counts
from core.types import FinishReason, TraceRecord
from tracerl_slime.sample import Sample

META_KEY = "tracerl"
"""Key of the ``Sample.metadata`` entry this plugin writes."""


def _base(sample: Any, rollout_id: int) -> Any:
    out = copy.deepcopy(sample)
    out.rollout_id = rollout_id
    out.remove_sample = False
    out.metadata = dict(out.metadata or {})
    return out


def rollout_id_of(sample: Any) -> int:
    """The integer rollout id a generate call stamps on every sibling."""
    if sample.rollout_id is not None:
        return int(sample.rollout_id)
    if sample.index is None:
        raise ValueError(
            "slime handed generate() a Sample with neither rollout_id nor index; slime's data "
            "source sets index on every sample (set one when building samples by hand)"
        )
    return int(sample.index)


def rows_to_samples(
    sample: Any,
    rows: Sequence[TraceRecord],
    *,
    reward: float,
    tokenizer: Any = None,
    info: dict[str, Any] | None = None,
) -> list[Any]:
    """One slime ``Sample`` per row of ``rows`` that trains something.

    Args:
        sample: The input sample slime passed to ``generate``.
        rows: The rollout's rows (``RolloutRunner`` output), in gateway order.
        reward: The rollout's reward, set on every sibling.
        tokenizer: Decodes ``response`` for slime's logs; None leaves it empty.
        info: Extra ``metadata["tracerl"]`` entries (status, counters).

    Returns:
        The siblings (possibly empty when no row trains a token).
    """
    rid = rollout_id_of(sample)
    kept = [r for r in rows if r.num_generated > 0]
    out = []
    for k, row in enumerate(kept):
        row.validate()
        start = row.prompt_length
        s = _base(sample, rid)
        s.tokens = list(row.token_ids)
        s.response_length = len(row.token_ids) - start
        s.loss_mask = list(row.loss_mask[start:])
        s.rollout_log_probs = [float(x) for x in row.logprobs[start:]]
        s.weight_versions = [str(t.weight_version) for t in row.turns]
        s.reward = float(reward)
        last = row.turns[-1].finish_reason if row.turns else FinishReason.STOP
        s.status = (
            Sample.Status.TRUNCATED if last is FinishReason.LENGTH else Sample.Status.COMPLETED
        )
        if tokenizer is not None:
            s.response = tokenizer.decode(row.token_ids[start:], skip_special_tokens=False)
        s.metadata[META_KEY] = {
            **(info or {}),
            "row": k,
            "rows": len(kept),
            "turns": len(row.turns),
            "forks": int(row.metadata.get("forks", 0) or 0),
            "ill_formed_tool_calls": int(row.metadata.get("ill_formed_tool_calls", 0) or 0),
            "parse": row_parse_counts(row),
        }
        out.append(s)
    return out


def failed_sample(
    sample: Any, *, pad_token_id: int, reason: str, status: str, info: dict[str, Any] | None = None
) -> Any:
    """The single ABORTED sample that stands for a failed rollout.

    It carries one masked response token (slime's trainer expects a non-empty
    response), reward 0.0 (slime's reward code needs a number, our
    post-processor ignores it) and ``remove_sample=True`` (slime zeroes its
    loss mask). ``info`` adds ``metadata["tracerl"]`` entries (the tracerl
    rollout id...), as for trained rows.
    """
    s = _base(sample, rollout_id_of(sample))
    prompt = list(s.tokens) if s.tokens else [int(pad_token_id)]
    s.tokens = prompt + [int(pad_token_id)]
    s.response_length = 1
    s.loss_mask = [0]
    s.rollout_log_probs = [0.0]
    s.reward = 0.0
    s.status = Sample.Status.ABORTED
    s.remove_sample = True
    s.metadata[META_KEY] = {**(info or {}), "status": status, "error": reason[-2000:], "rows": 0}
    return s

"""A stored training step whose turns carry tool-call parse statuses, for the viewer tests.

Written with the real trace writer from rows laid out by hand (the gateway's side, which
statuses a reply gets, is tested in tests/gateway/test_parse_status.py): three rollouts,
one whose first turn's call was bad JSON, one that called a tool and answered, one that
was offered no tools.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.rundir.traces import TraceWriter
from core.types import (
    FinishReason,
    ParseStatus,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)

BAD_JSON_DETAIL = "tool call is not JSON: Expecting property name enclosed in double quotes"
"""What the bad-JSON turn's parser said."""

STATUSES = {
    "r-json": [ParseStatus.BAD_JSON, ParseStatus.CALLS],
    "r-calls": [ParseStatus.CALLS, ParseStatus.TEXT],
    "r-plain": [ParseStatus.NO_TOOLS],
}
"""Each rollout's turns, in order."""


def _outcome(rid: str, statuses: list[ParseStatus]) -> Any:
    spans, ids, conversation = [], list(range(10, 20)), [{"parent": -1, "messages": [{"role": "user", "content": "2+2?"}], "turn": None}]
    for k, status in enumerate(statuses):
        start = len(ids)
        ids += list(range(30 + 10 * k, 36 + 10 * k))
        detail = BAD_JSON_DETAIL if status is ParseStatus.BAD_JSON else ""
        spans.append(TurnSpan(start, len(ids), FinishReason.STOP, 1, parse=status, parse_detail=detail))
        node: dict[str, Any] = {
            "parent": len(conversation) - 1, "messages": [{"role": "assistant", "content": f"reply {k + 1}"}],
            "turn": k, "weight_version": 1, "finish_reason": "stop", "parse": status.value,
        }
        if detail:
            node["parse_detail"] = detail
        conversation.append(node)
        ids += [20, 21]  # a tool result or the next user message
        conversation.append({"parent": len(conversation) - 1, "messages": [{"role": "user", "content": "go on"}], "turn": None})
    ids = ids[:-2]
    conversation.pop()
    mask = [0] * len(ids)
    for span in spans:
        mask[span.start : span.end] = [1] * (span.end - span.start)
    row = TraceRecord(f"tr-{rid}", ids, mask, [-0.5 * m for m in mask], 10, spans, metadata={"shared_turns": 0})
    return SimpleNamespace(
        request=RolloutRequest(rid, "g0", {"q": "2+2?"}, "http://x/v1", f"tr-{rid}", "m"),
        result=RolloutResult(rid, RolloutStatus.OK, reward=0.5, elapsed_s=1.0),
        rows=[row], faults={"model_turns": len(statuses)}, conversation=conversation,
    )


def write_parse_step(run_dir: Path, step: int = 1) -> None:
    """Store ``STATUSES``'s rollouts as training step ``step`` of ``run_dir``."""
    outcomes = [_outcome(rid, statuses) for rid, statuses in STATUSES.items()]
    TraceWriter(run_dir, 1, decode=lambda ids: f"t{ids[0]} ").write_step(step, outcomes, {}, weight_version=1)
    (run_dir / "metrics.jsonl").touch()

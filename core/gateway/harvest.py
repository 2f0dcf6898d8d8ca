"""What the trainer takes from a finished session: its rows, counters and conversation.

Defines:

- ``Harvest``: one session's rows, counters and message tree, read once as it ends.
- ``harvest_session``: finish (or, when someone already finished it, peek) and drop a
  session of an in-process ``Gateway``; None when it is unknown (dropped).
- ``harvest_to_json`` / ``harvest_from_json``: the same over HTTP
  (``POST /admin/sessions/{sid}/harvest``), exact: a row read back equals the row
  the gateway built, so the trainer gets the same thing from a gateway shard in
  another process as from the gateway in its own (docs/scale.md).
- ``conversation_tree``: a session's message tree as a flat preorder list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from core.types import (
    DEFAULT_POLICY,
    FinishReason,
    ParseStatus,
    RolloutStatus,
    Segment,
    TraceRecord,
    TurnSpan,
)

if TYPE_CHECKING:
    from core.gateway.service import Gateway

__all__ = ["Harvest", "conversation_tree", "harvest_from_json", "harvest_session", "harvest_to_json"]


@dataclass
class Harvest:
    """One session's record as it ends."""

    rows: list[TraceRecord]
    """Its trace rows (``Gateway.finish_session``)."""
    counters: dict[str, int] = field(default_factory=dict)
    """``Session.counters``, plus ``in_flight_at_finish`` (turns still being sampled) and
    ``model_turns`` (turns recorded), read before the session was finished."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """``conversation_tree`` of the session."""
    finished_early: bool = False
    """Someone finished the session before the trainer did (its rows are still there)."""
    lost: bool = False
    """The session went away between reading its counters and its rows: no rows."""


def harvest_session(gateway: Gateway, sid: str) -> Harvest | None:
    """Finish and drop ``sid``; its ``Harvest``, or None when it is unknown (dropped).

    Tolerates a session someone else already finished (its rows are still there), so
    one odd session never fails the step it belongs to.
    """
    try:
        session = gateway.session(sid)
    except Exception:  # dropped (admin DELETE): nothing left to read
        return None
    counters = {key: int(value) for key, value in session.counters.items()}
    counters["in_flight_at_finish"] = int(session.in_flight)
    counters["model_turns"] = len(session.turns)
    out = Harvest(rows=[], counters=counters, conversation=conversation_tree(session.root, session.turns))
    try:
        if session.closed:
            out.finished_early = True
            out.rows = gateway.peek_rows(sid)
        else:
            out.rows = gateway.finish_session(sid)
    except Exception:  # the session went away between the two calls
        out.rows, out.lost = [], True
    finally:
        gateway.drop_session(sid)
    return out


def harvest_to_json(harvest: Harvest) -> dict[str, Any]:
    """``harvest`` as plain JSON values (enums as their strings, tuples as lists)."""
    return {
        "rows": [asdict(r) for r in harvest.rows],
        "counters": harvest.counters,
        "conversation": harvest.conversation,
        "finished_early": harvest.finished_early,
        "lost": harvest.lost,
    }


def harvest_from_json(data: Mapping[str, Any]) -> Harvest:
    """The ``Harvest`` ``harvest_to_json`` wrote."""
    return Harvest(
        rows=[_record(r) for r in data["rows"]],
        counters={str(k): int(v) for k, v in data["counters"].items()},
        conversation=list(data["conversation"]),
        finished_early=bool(data["finished_early"]),
        lost=bool(data["lost"]),
    )


def _record(d: Mapping[str, Any]) -> TraceRecord:
    status = d.get("status")
    return TraceRecord(
        session_id=str(d["session_id"]),
        token_ids=[int(t) for t in d["token_ids"]],
        loss_mask=[int(m) for m in d["loss_mask"]],
        logprobs=[float(x) for x in d["logprobs"]],
        prompt_length=int(d["prompt_length"]),
        turns=[_span(t) for t in d["turns"]],
        row_index=int(d["row_index"]),
        rollout_id=d.get("rollout_id"),
        group_id=d.get("group_id"),
        reward=d.get("reward"),
        status=RolloutStatus(status) if status is not None else None,
        metadata=dict(d["metadata"]),
    )


def _span(d: Mapping[str, Any]) -> TurnSpan:
    parse = d.get("parse")
    return TurnSpan(
        start=int(d["start"]),
        end=int(d["end"]),
        finish_reason=FinishReason(d["finish_reason"]),
        weight_version=int(d["weight_version"]),
        segments=tuple(Segment(int(g["start"]), int(g["end"]), int(g["weight_version"])) for g in d["segments"]),
        parse=ParseStatus(parse) if parse is not None else None,
        parse_detail=str(d.get("parse_detail") or ""),
        policy=str(d.get("policy") or DEFAULT_POLICY),
    )


def conversation_tree(root: Any, turns: Sequence[Any]) -> list[dict[str, Any]]:
    """A gateway session's message tree as a flat preorder list.

    ``root`` is ``Session.root`` (nodes with ``canon``, ``turn`` and ``children``),
    ``turns`` is ``Session.turns``; a node's ``turn`` is the index of its generated
    turn there (with that turn's ``weight_version``, ``finish_reason`` and, when a
    weight update interrupted it, ``weight_versions``: each segment's, in order; ``policy``
    when not ``DEFAULT_POLICY``), or None for messages the agent sent. Read before the session is
    dropped; the message dicts are shared, not copied (the session is gone after).
    """
    index = {id(t): i for i, t in enumerate(turns)}
    out: list[dict[str, Any]] = []
    stack: list[tuple[Any, int]] = [(child, -1) for child in reversed(root.children)]
    while stack:
        node, parent = stack.pop()
        me = len(out)
        entry: dict[str, Any] = {"parent": parent, "messages": node.canon, "turn": None}
        if node.turn is not None:
            entry["turn"] = index.get(id(node.turn))
            entry["weight_version"] = node.turn.weight_version
            entry["finish_reason"] = str(node.turn.finish_reason)
            if node.turn.segments:
                entry["weight_versions"] = [g.weight_version for g in node.turn.segments]
            entry["parse"] = str(node.turn.parse)
            if node.turn.parse_detail:
                entry["parse_detail"] = node.turn.parse_detail
            if node.turn.policy != DEFAULT_POLICY:
                entry["policy"] = node.turn.policy
        out.append(entry)
        stack.extend((child, me) for child in reversed(node.children))
    return out

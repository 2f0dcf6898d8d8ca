"""A session's message tree, its generated turns, and the rows they pack into.

Defines:

- ``Turn``: one generated turn; its tokens live in a buffer shared along a
  chain of turns (a child that extends its parent appends in place), so a
  session's memory stays linear in its context, not quadratic.
- ``Node``: one canonical message in the tree; generated assistant messages
  carry their ``Turn``.
- ``match_path``: how far a request's messages follow the tree (raw JSON
  compared first, canonical form only on a miss; a still-valid earlier match
  of the same history is taken whole after one list comparison).
- ``Matched``: that earlier match, kept per session.
- ``reserve_prompt`` / ``release``: build the prompt that extends a served turn.
- ``build_rows``: pack the turns into ``TraceRecord`` rows.

Packing: every turn's prompt starts with the exact tokens of the turn it
extends (its ``parent``, always of the same policy), so each chain from a first turn
to a leaf is one row, and a row holds one policy's turns.
A turn that several rows share is trained (``loss_mask`` 1) in the first row
only and is context (mask 0, logprob 0.0) in the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.gateway.messages import Unit, raws_of
from core.types import DEFAULT_POLICY, FinishReason, ParseStatus, Segment, TraceRecord, TurnSpan

__all__ = ["Matched", "Node", "Turn", "build_rows", "match_path", "release", "reserve_prompt"]


@dataclass(eq=False, slots=True)
class Turn:
    """One generated turn: ``buf[:prompt_len]`` was fed, ``buf[prompt_len:end]`` generated."""

    buf: list[int]
    """Token buffer shared with the turns of the same chain (only ever appended to)."""
    prompt_len: int
    """Tokens fed to the model for this turn."""
    end: int
    """One past the turn's last generated token."""
    logprobs: list[float]
    """Sampler logprobs of the generated tokens."""
    finish_reason: FinishReason
    """Why the sampler stopped."""
    weight_version: int
    """Weights that generated the turn (the first segment's when it has several)."""
    params: dict[str, Any]
    """Sampling parameters actually used (temperature, top_p, top_k, max_tokens)."""
    parent: Turn | None
    """The turn whose served tokens this prompt extends; None after a full render."""
    emitted_closer: str
    """Text of the stop token the turn ended with (``<|im_end|>``), or ''."""
    ill_formed: bool = False
    """The turn tried to call a tool and the call did not parse."""
    choice_violated: bool = False
    """The turn did not follow its request's ``tool_choice`` (``core.gateway.toolchoice``)."""
    reasoning: bool = False
    """Reasoning was split off the turn's text (``reasoning_content`` of its message)."""
    parse: ParseStatus = ParseStatus.NO_TOOLS
    """What the tool-call parser made of the turn (``core.gateway.reply.parse_status``)."""
    parse_detail: str = ""
    """Why a failed parse failed; '' otherwise."""
    extended: bool = False
    """A child already appends to ``buf`` in place; further children copy."""
    segments: tuple[Segment, ...] = ()
    """The sampler's segments (offsets into the generated tokens) when a weight update
    interrupted the turn; empty when one version generated it all."""
    policy: str = DEFAULT_POLICY
    """The policy that generated the turn; a turn extends (``parent``) only one of its own."""


@dataclass(eq=False, slots=True)
class Node:
    """One canonical message (or one wire unit's messages) in the session tree."""

    canon: list[dict[str, Any]]
    """Canonical message(s) of the unit."""
    raw: Any = None
    """The wire JSON last matched to it; equality with it skips conversion."""
    turn: Turn | None = None
    """Set on generated assistant messages."""
    children: list[Node] = field(default_factory=list)
    """Following messages, oldest first."""


@dataclass(slots=True)
class Matched:
    """``match_path``'s answer for a request's messages, for as long as the tree is unchanged.

    Why: agents resend the whole history every turn, so matching it message by
    message costs Python work per message, growing with the context. The turn
    that follows resends these messages first; when its raw messages start with
    ``raws`` (one C-speed list comparison) and the tree is still at ``version``,
    ``match_path`` would walk exactly to ``nodes`` (the last raw-equal child at
    each level is the one it picked, and nothing was added since), so they are
    taken whole.
    """

    version: int
    """``Session.tree_version`` the match holds for."""
    raws: list[Any]
    """The raw messages matched (a private copy of the list)."""
    nodes: list[Node]
    """One node per raw message: what ``match_path`` returns for them."""
    chain_len: int = 0
    """Linear mode: the length of the session's chain (its newest children from the root)
    when ``tip`` is set."""
    tip: Node | None = None
    """Linear mode: the chain's last node when it is the turn recorded after ``nodes``
    (that turn extended the chain); None: unknown, walk the chain."""


def match_path(root: Node, units: Sequence[Unit], prefix: Matched | None = None) -> list[Node]:
    """The tree nodes matching a prefix of ``units``, most recent branch preferred.

    ``prefix``: a ``Matched`` the caller knows to be current (tree unchanged since);
    when the units' raw messages start with its ``raws``, its nodes are the first matches.
    """
    path: list[Node] = []
    node = root
    start = 0
    if prefix is not None:
        n = len(prefix.raws)
        if 0 < n <= len(units) and raws_of(units)[:n] == prefix.raws:
            path = list(prefix.nodes)
            node = path[-1]
            start = n
    for i in range(start, len(units)):
        unit = units[i]
        children = node.children
        nxt = None
        for child in reversed(children):
            if child.raw is not None and child.raw == unit.raw:
                nxt = child
                break
        if nxt is None and children:
            canon = unit.canon()
            for child in reversed(children):
                if child.canon == canon or (child.turn is not None and _without_reasoning(child.canon) == canon):
                    nxt = child
                    child.raw = unit.raw
                    break
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path


def _without_reasoning(canon: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A generated message as a client that drops reasoning echoes it (most clients do)."""
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in canon]


def reserve_prompt(parent: Turn, delta: list[int]) -> tuple[list[int], bool]:
    """The prompt ``parent``'s tokens + ``delta``; appended in place when no other child did.

    Returns:
        (prompt buffer, owned) where owned means it is ``parent.buf`` and must be
        given back with ``release`` if the turn is not recorded.
    """
    if not parent.extended and len(parent.buf) == parent.end:
        parent.extended = True
        parent.buf.extend(delta)
        return parent.buf, True
    buf = parent.buf[: parent.end]
    buf.extend(delta)
    return buf, False


def release(parent: Turn | None, owned: bool) -> None:
    """Undo ``reserve_prompt`` for a turn that will not be recorded."""
    if parent is not None and owned:
        del parent.buf[parent.end :]
        parent.extended = False


def build_rows(
    session_id: str,
    turns: Sequence[Turn],
    *,
    rollout_id: str | None,
    group_id: str | None,
    metadata: dict[str, Any],
) -> list[TraceRecord]:
    """Pack ``turns`` (creation order) into rows, one per chain ending in a leaf turn."""
    parents = {id(t.parent) for t in turns if t.parent is not None}
    trained: set[int] = set()
    rows: list[TraceRecord] = []
    for leaf in turns:
        if id(leaf) in parents:
            continue
        chain: list[Turn] = []
        t: Turn | None = leaf
        while t is not None:
            chain.append(t)
            t = t.parent
        chain.reverse()
        n = leaf.end
        token_ids = leaf.buf[:n]
        loss_mask = [0] * n
        logprobs = [0.0] * n
        spans: list[TurnSpan] = []
        shared = 0
        for turn in chain:
            s, e = turn.prompt_len, turn.end
            if id(turn) in trained:
                shared += 1
            else:
                trained.add(id(turn))
                loss_mask[s:e] = [1] * (e - s)
                logprobs[s:e] = turn.logprobs
            segments = tuple(Segment(s + g.start, s + g.end, g.weight_version) for g in turn.segments)
            spans.append(
                TurnSpan(
                    s, e, turn.finish_reason, turn.weight_version, segments, turn.parse, turn.parse_detail, turn.policy
                )
            )
        meta = dict(metadata)
        meta.update(
            row_turns=len(chain),
            shared_turns=shared,
            truncated=leaf.finish_reason is FinishReason.LENGTH,
            turn_params=[turn.params for turn in chain],
            ill_formed_turns=sum(turn.ill_formed for turn in chain),
            tool_choice_violated_turns=sum(turn.choice_violated for turn in chain),
        )
        rows.append(
            TraceRecord(
                session_id=session_id,
                token_ids=token_ids,
                loss_mask=loss_mask,
                logprobs=logprobs,
                prompt_length=chain[0].prompt_len,
                turns=spans,
                row_index=len(rows),
                rollout_id=rollout_id,
                group_id=group_id,
                metadata=meta,
            )
        )
    forks = max(len(rows) - 1, 0)
    for row in rows:
        row.metadata["forks"] = forks
        row.metadata["rows"] = len(rows)
    return rows

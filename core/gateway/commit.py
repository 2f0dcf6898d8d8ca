"""Committing a recorded turn to its session: the turn list and the history tree.

Defines:

- ``commit_turn``: append the turn, attach the request's new messages and the assistant's
  answer to the tree under the matched path, and keep the match for the next request
  when nothing changed the tree in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.gateway.history import Matched, Node, Turn
from core.gateway.messages import Unit, raws_of
from core.gateway.prompt import Prompt
from core.gateway.session import Session

__all__ = ["commit_turn"]


def commit_turn(
    s: Session, units: Sequence[Unit], prompt: Prompt, turn: Turn, assistant: dict[str, Any]
) -> None:
    """Record ``turn`` (answered with the canonical ``assistant`` message) in session ``s``,
    whose request sent ``units`` and was built into ``prompt``."""
    s.turns.append(turn)
    node = prompt.path[-1] if prompt.path else s.root
    nodes = list(prompt.path)
    for unit in units[prompt.matched :]:
        child = Node(canon=unit.canon(), raw=unit.raw)
        node.children.append(child)
        node = child
        nodes.append(child)
    answer = Node(canon=[assistant], turn=turn)
    node.children.append(answer)
    s.tree_version += 1
    s.matched = None
    if prompt.tree_version == s.tree_version - 1 and nodes:
        # Nothing changed the tree between this turn's match and now: ``nodes`` is what
        # match_path returns for these messages until the tree changes again. The raws
        # already kept stand in for the equal ones just parsed, so a session keeps one
        # copy of its history's JSON, not two.
        raws = raws_of(units)
        reused = prompt.reused_raws
        kept = reused + raws[len(reused) :] if reused is not None else list(raws)
        s.matched = Matched(s.tree_version, kept, nodes, len(nodes) + 1, answer if prompt.at_chain_end else None)

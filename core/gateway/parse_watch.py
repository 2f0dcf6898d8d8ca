"""Tool-call parse statuses per step: their metrics, and the console warnings they raise.

- ``parse_metrics``: a step's ``gateway/*`` keys, counted from the parse status the gateway
  recorded on each generated turn (``core.types.ParseStatus``);
- ``row_parse_counts``, ``metrics_from_counts``: one row's counts by status, and the metrics of
  summed counts (the verl and slime plugins, whose trainers see rows, not turns);
- ``ParseWatch``: remembers earlier steps' failure rates and says when to warn.

The training loop reports them per step (``core.trainer``), ``python -m core.eval`` per evaluation,
and the verl and slime plugins per batch they hand their trainer.

Why a warning and not only a metric: a run whose tool calls stopped parsing (a template
changed, a parser that does not read the model's format) still trains and its reward may
even rise; a metric nobody plots does not stop it. Both warnings go to the console
beside the step's line; neither stops the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.types import ParseStatus, TraceRecord, TurnSpan

__all__ = ["JUMP_FACTOR", "JUMP_FLOOR", "ParseWatch", "metrics_from_counts", "own_turns", "parse_metrics", "row_parse_counts"]

FAILED_RATE = "gateway/tool_parse_failed"
"""Share of the step's turns with tools offered whose parse failed (0.0 when none offered)."""
WITH_TOOLS = "gateway/turns_with_tools"
"""The step's turns whose request offered tools."""
COUNT = "gateway/parse/"
"""Prefix of the count of the step's turns in each ``ParseStatus``."""

JUMP_FLOOR = 0.10
"""A step's failure rate below this never warns (a rare failure is the model's to learn)."""
JUMP_FACTOR = 2.0
"""A step's failure rate jumps when it is at least ``JUMP_FLOOR`` and more than this many
times the mean rate of the earlier steps that offered tools (the first such step: when
it is at least ``JUMP_FLOOR``)."""


def own_turns(row: TraceRecord) -> list[TurnSpan]:
    """The turns ``row`` trains: a turn shared by several rows (a fork) is counted in the first.

    The shared turns of a gateway row are its first ``shared_turns`` (every ancestor of a
    turn an earlier row holds is in that row too)."""
    shared = int(row.metadata.get("shared_turns", 0) or 0)
    return list(row.turns[shared:])


def row_parse_counts(row: TraceRecord) -> dict[str, int]:
    """How many of the turns ``row`` trains (``own_turns``) ended in each parse status, by the
    status's value (statuses with none left out): what the verl and slime plugins attach to
    each row they hand their trainer, summed per batch by ``metrics_from_counts``."""
    return dict(Counter(t.parse.value for t in own_turns(row) if t.parse is not None))


def metrics_from_counts(counts: Mapping[str, int]) -> dict[str, float]:
    """``gateway/tool_parse_failed``, ``gateway/turns_with_tools`` and ``gateway/parse/<status>``
    for every status, from turn counts by status value (unknown values ignored)."""
    found = {s: int(counts.get(s.value, 0) or 0) for s in ParseStatus}
    offered = sum(n for s, n in found.items() if s.tools_offered)
    failed = sum(n for s, n in found.items() if s.failed)
    return {
        FAILED_RATE: failed / offered if offered else 0.0,
        WITH_TOOLS: float(offered),
        **{COUNT + s.value: float(n) for s, n in found.items()},
    }


def parse_metrics(rows: Iterable[TraceRecord]) -> dict[str, float]:
    """``metrics_from_counts`` over the generated turns of ``rows``. Turns with no status (rows
    built outside the gateway, traces written before it recorded one) are not counted."""
    counts: Counter[str] = Counter()
    for row in rows:
        counts.update(row_parse_counts(row))
    return metrics_from_counts(counts)


def _counts(record: Mapping[str, Any]) -> dict[str, int]:
    return {s.value: int(record.get(COUNT + s.value, 0) or 0) for s in ParseStatus}


@dataclass
class ParseWatch:
    """Warns when a step's tool-call failure rate jumps (once, until a step no longer jumps),
    and when tools were offered in a step and no turn called one (once, until a turn calls
    one again). A resumed run starts with no history."""

    rates: list[float] = field(default_factory=list)
    """Failure rates of the earlier steps that offered tools."""
    high: bool = False
    """The last step that offered tools jumped (warned already)."""
    silent: bool = False
    """The last step that offered tools had no call (warned already)."""

    def warnings(self, record: Mapping[str, Any]) -> list[str]:
        """The warnings for one step's metrics record (``parse_metrics`` keys); [] when its
        turns offered no tools or the record has no parse metrics."""
        offered = int(record.get(WITH_TOOLS, 0) or 0)
        if offered <= 0:
            return []
        step = record.get("step", "?")
        rate = float(record.get(FAILED_RATE, 0.0))
        counts = _counts(record)
        out: list[str] = []
        before = sum(self.rates) / len(self.rates) if self.rates else 0.0
        jumped = rate >= JUMP_FLOOR and rate > JUMP_FACTOR * before
        if jumped and not self.high:
            reasons = sorted((s.value for s in ParseStatus if s.failed and counts[s.value]), key=lambda s: -counts[s])
            failed = ", ".join(f"{counts[s]} {s}" for s in reasons)
            earlier = f"mean of earlier steps {before:.0%}" if self.rates else "first step with tools"
            out.append(
                f"warning: step {step}: tool calls failed to parse in {sum(counts[s] for s in reasons)} of {offered} "
                f"turns with tools offered ({rate:.0%}; {earlier}): {failed}. "
                "The viewer's parse filter (python -m core.view RUN_DIR) shows the turns and why"
            )
        self.rates.append(rate)
        self.high = jumped
        if counts[ParseStatus.CALLS.value] == 0:
            if not self.silent:
                shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n and s != ParseStatus.NO_TOOLS.value)
                out.append(
                    f"warning: step {step}: tools were offered in {offered} turns and no turn called one "
                    f"({shown}); if the task needs tools, check that the model writes the chat template's "
                    "tool-call format and that gateway.tool_parser reads it (said once until a turn calls a tool)"
                )
            self.silent = True
        else:
            self.silent = False
        return out

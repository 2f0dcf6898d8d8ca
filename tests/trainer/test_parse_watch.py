"""A step's parse-status metrics and the console warnings they raise (``core.trainer.parse_watch``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.trainer.parse_watch import JUMP_FACTOR, JUMP_FLOOR, ParseWatch, parse_metrics
from core.types import FinishReason, ParseStatus, TraceRecord, TurnSpan

S = ParseStatus


def row(statuses: Sequence[ParseStatus | None], shared: int | None = None) -> TraceRecord:
    """A row with one 2-token turn per status (the first ``shared`` trained in another row)."""
    turns = [TurnSpan(2 + 2 * i, 4 + 2 * i, FinishReason.STOP, 0, parse=s) for i, s in enumerate(statuses)]
    n = 2 + 2 * len(statuses)
    meta: dict[str, Any] = {} if shared is None else {"shared_turns": shared}
    return TraceRecord("s", [0] * n, [0, 0] + [1] * (n - 2), [0.0] * n, 2, turns, metadata=meta)


def record(step: int, statuses: Sequence[ParseStatus]) -> dict[str, Any]:
    return {"step": step, **parse_metrics([row(statuses)])}


def test_metrics_count_each_status_and_the_failure_rate_among_turns_with_tools() -> None:
    rows = [
        row([S.NO_TOOLS, S.CALLS, S.TEXT, S.BAD_JSON]),
        row([S.UNKNOWN_TOOL, S.SCHEMA_MISMATCH, S.MARKUP_NO_CALL, S.CALLS, None]),
    ]
    m = parse_metrics(rows)
    assert m["gateway/turns_with_tools"] == 7  # the no_tools turn and the unrecorded one are not
    assert m["gateway/tool_parse_failed"] == 4 / 7
    assert {k: v for k, v in m.items() if k.startswith("gateway/parse/")} == {
        "gateway/parse/no_tools": 1,
        "gateway/parse/text": 1,
        "gateway/parse/calls": 2,
        "gateway/parse/unknown_tool": 1,
        "gateway/parse/bad_json": 1,
        "gateway/parse/schema_mismatch": 1,
        "gateway/parse/markup_no_call": 1,
    }


def test_a_turn_shared_by_forked_rows_is_counted_once() -> None:
    """A fork's second row repeats the turns before the fork (``shared_turns``): counted in
    the first row only, as they are trained only there."""
    first = row([S.BAD_JSON, S.CALLS], shared=0)
    second = row([S.BAD_JSON, S.TEXT], shared=1)
    m = parse_metrics([first, second])
    assert m["gateway/parse/bad_json"] == 1 and m["gateway/turns_with_tools"] == 3


def test_no_tools_offered_gives_a_zero_rate_and_no_warning() -> None:
    m = parse_metrics([row([S.NO_TOOLS, S.NO_TOOLS])])
    assert m["gateway/tool_parse_failed"] == 0.0 and m["gateway/turns_with_tools"] == 0
    assert ParseWatch().warnings({"step": 1, **m}) == []
    assert ParseWatch().warnings({"step": 1}) == []  # a record without parse metrics (an eval)


def test_a_jump_in_the_failure_rate_warns_with_the_counts_by_reason() -> None:
    watch = ParseWatch()
    calm = [S.CALLS] * 19 + [S.BAD_JSON]  # 5%: below the floor
    assert watch.warnings(record(1, calm)) == []
    assert watch.warnings(record(2, calm)) == []
    jump = [S.CALLS] * 6 + [S.BAD_JSON] * 3 + [S.UNKNOWN_TOOL]  # 40%: above the floor, 8x the mean
    (warning,) = watch.warnings(record(3, jump))
    assert warning.startswith("warning: step 3: tool calls failed to parse in 4 of 10 turns")
    assert "40%; mean of earlier steps 5%" in warning and "3 bad_json, 1 unknown_tool" in warning
    assert "python -m core.view" in warning
    # Still more than twice the earlier mean (17%), but said once: no warning per step.
    assert watch.warnings(record(4, jump)) == []
    # 40% against a mean of 24% is no jump; a later jump is warned again.
    assert watch.warnings(record(5, jump)) == []
    assert watch.warnings(record(6, [S.BAD_JSON] * 10)) != []


def test_the_jump_rule_is_the_floor_and_the_factor() -> None:
    """At the floor and more than JUMP_FACTOR times the earlier mean warns; just below either
    does not. The first step with tools compares with nothing: the floor alone decides."""
    assert JUMP_FLOOR == 0.10 and JUMP_FACTOR == 2.0
    assert ParseWatch().warnings(record(1, [S.CALLS] * 9 + [S.BAD_JSON]))  # 10%
    assert not ParseWatch().warnings(record(1, [S.CALLS] * 11 + [S.BAD_JSON]))  # 8.3%
    watch = ParseWatch(rates=[0.10])
    assert not watch.warnings(record(2, [S.CALLS] * 4 + [S.BAD_JSON]))  # 20% = 2x: not more
    watch = ParseWatch(rates=[0.10])
    assert watch.warnings(record(2, [S.CALLS] * 3 + [S.BAD_JSON]))  # 25% > 2x


def test_tools_offered_and_no_call_warns_once_until_a_turn_calls_again() -> None:
    watch = ParseWatch()
    (warning,) = watch.warnings(record(1, [S.TEXT] * 8))
    assert warning.startswith("warning: step 1: tools were offered in 8 turns and no turn called one (8 text)")
    assert watch.warnings(record(2, [S.TEXT] * 8)) == []  # said once
    assert watch.warnings(record(3, [S.TEXT] * 7 + [S.CALLS])) == []  # a call: the state resets
    assert len(watch.warnings(record(4, [S.TEXT] * 8))) == 1  # silent again: warned again


def test_both_warnings_in_one_step() -> None:
    """Every turn failed: the rate jumped and nothing was called."""
    warnings = ParseWatch().warnings(record(1, [S.MARKUP_NO_CALL] * 4))
    assert len(warnings) == 2
    assert "4 markup_no_call" in warnings[0] and "no turn called one (4 markup_no_call)" in warnings[1]

"""History modes: tree forks on divergence and trains shared turns once; linear resets."""

from __future__ import annotations

from typing import Any

from core.gateway import GatewayConfig
from tests.gateway.conftest import Harness


def _chat(h: Harness, sid: str, messages: list[dict[str, Any]]) -> str:
    out = h.openai(sid).chat.completions.create(model="tiny", messages=messages)
    return out.choices[0].message.content or ""


def _full(h: Harness, messages: list[dict[str, Any]]) -> list[int]:
    text = h.tok.apply_chat_template(messages, tokenize=False)
    return list(h.tok.encode(text, add_special_tokens=False))


def _trained_text(h: Harness, row: Any) -> list[str]:
    out, cur = [], []
    for t, m in zip(row.token_ids, row.loss_mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            out.append(h.tok.decode(cur))
            cur = []
    if cur:
        out.append(h.tok.decode(cur))
    return out


def test_tree_rewritten_history_forks_and_trains_shared_turn_once(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(history_mode="tree"))
    h.push("A1", "A2", "A3")
    sid = h.session()
    sys_u1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"}]
    a1 = _chat(h, sid, sys_u1)
    base = [*sys_u1, {"role": "assistant", "content": a1}]
    a2 = _chat(h, sid, [*base, {"role": "user", "content": "u2"}])
    a3 = _chat(h, sid, [*base, {"role": "user", "content": "u2 rewritten"}])
    assert (a1, a2, a3) == ("A1", "A2", "A3")
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 2
    for row in rows:
        row.validate()
        assert row.metadata["forks"] == 1
    assert _trained_text(h, rows[0]) == ["A1<|im_end|>", "A2<|im_end|>"]
    assert _trained_text(h, rows[1]) == ["A3<|im_end|>"]  # A1 is context here, trained in row 0
    assert rows[1].metadata["shared_turns"] == 1
    conv = [*base, {"role": "user", "content": "u2 rewritten"}, {"role": "assistant", "content": "A3"}]
    full = _full(h, conv)
    assert rows[1].token_ids == full[: len(rows[1].token_ids)]
    # Both branches reuse the tokens served for A1 (one full render for the whole session).
    assert h.gw.session(sid).counters["full_renders"] == 1


def test_tree_sub_agent_with_other_system_prompt_is_its_own_row(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(history_mode="tree"))
    h.push("main", "sub", "main2")
    sid = h.session()
    main = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "task"}]
    m1 = _chat(h, sid, main)
    _chat(h, sid, [{"role": "system", "content": "sub agent"}, {"role": "user", "content": "subtask"}])
    _chat(h, sid, [*main, {"role": "assistant", "content": m1}, {"role": "user", "content": "sub said x"}])
    rows = h.call(h.gw.finish_session, sid)
    assert [r.metadata["row_turns"] for r in rows] == [1, 2]
    assert _trained_text(h, rows[0]) == ["sub<|im_end|>"]
    assert _trained_text(h, rows[1]) == ["main<|im_end|>", "main2<|im_end|>"]
    assert sum(r.num_generated for r in rows) == sum(len(h.reply(t)) for t in ("main", "sub", "main2"))


def test_tree_regenerate_same_prompt_gives_sibling_rows(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(history_mode="tree"))
    h.push("x", "y")
    sid = h.session()
    msgs = [{"role": "user", "content": "q"}]
    _chat(h, sid, msgs)
    _chat(h, sid, msgs)
    rows = h.call(h.gw.finish_session, sid)
    assert [_trained_text(h, r) for r in rows] == [["x<|im_end|>"], ["y<|im_end|>"]]
    assert rows[0].token_ids[: rows[0].prompt_length] == rows[1].token_ids[: rows[1].prompt_length]


def test_linear_divergence_resets_into_new_row(harness: Harness) -> None:
    h = harness
    h.push("A1", "A2", "B1")
    sid = h.session()
    u1 = [{"role": "user", "content": "u1"}]
    _chat(h, sid, u1)
    _chat(h, sid, [*u1, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "u2"}])
    _chat(h, sid, [{"role": "user", "content": "compacted history"}])
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 2 and rows[0].metadata["nonlinear_resets"] == 1
    assert _trained_text(h, rows[0]) == ["A1<|im_end|>", "A2<|im_end|>"]
    assert _trained_text(h, rows[1]) == ["B1<|im_end|>"]


def test_linear_feeds_served_tokens_even_if_client_edits_echo_whitespace(harness: Harness) -> None:
    """An echoed assistant message that differs from what was served is a divergence, not silent drift."""
    h = harness
    h.push("A1", "A2")
    sid = h.session()
    u1 = [{"role": "user", "content": "u1"}]
    _chat(h, sid, u1)
    _chat(h, sid, [*u1, {"role": "assistant", "content": "A1 "}, {"role": "user", "content": "u2"}])
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 2 and rows[0].metadata["nonlinear_resets"] == 1


def test_linear_long_session_is_one_row_and_renders_once(harness: Harness) -> None:
    h = harness
    n = 12
    h.push(*[f"r{i}" for i in range(n)])
    sid = h.session()
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "S"}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"q{i}"})
        msgs.append({"role": "assistant", "content": _chat(h, sid, msgs)})
    (row,) = h.call(h.gw.finish_session, sid)
    assert len(row.turns) == n and h.gw.session(sid).counters["full_renders"] == 1
    full = _full(h, msgs)
    assert row.token_ids == full[: len(row.token_ids)]
    # The last prompt is the row minus the last turn: fed the exact served tokens.
    assert list(h.sampler.calls[-1].prompt_token_ids) == row.token_ids[: row.turns[-1].start]

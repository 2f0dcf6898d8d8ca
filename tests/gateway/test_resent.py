"""A resent body is parsed only past the bytes it resends, and always as ``json`` parses it.

``core.gateway.resent.parse_turn_body`` keeps each session's last body and its parsed
messages; the next body's messages whose bytes are unchanged are those very objects,
and only the bytes after them are parsed. These tests check that every body, whatever
the previous one was, parses to exactly what ``json.loads`` gives (or gets the full
parser's 400), that resent messages are reused by identity only up to the first byte
that changed, and that the gateway's turn routes use it.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from core.gateway.app import _loads, parse_body
from core.gateway.errors import GatewayError
from core.gateway.resent import ResentBody, parse_turn_body


def _parse(raw: bytes, previous: ResentBody | None) -> tuple[dict[str, Any], ResentBody | None]:
    return parse_turn_body(raw, previous, parse_body, _loads)


def _same(got: Any, want: Any) -> None:
    """Equal as ``json`` would write them, with ints and floats told apart (``repr``)."""
    assert repr(got) == repr(want)
    assert json.dumps(got) == json.dumps(want)


def _outcome(raw: bytes, previous: ResentBody | None) -> tuple[str, Any]:
    try:
        body, _ = _parse(raw, previous)
    except GatewayError as err:
        return "error", (err.status, str(err))
    return "ok", repr(body)


def _full(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", repr(parse_body(raw))
    except GatewayError as err:
        return "error", (err.status, str(err))


def _conversation(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i}: é ✓ 😀 [{{\"]}}"})
        msgs.append({"role": "assistant", "content": f"answer {i}", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": '{"k": [1, 2]}'}}]})
    return msgs


def test_a_growing_conversation_reuses_every_resent_message() -> None:
    """Turn after turn (fields before and after the messages, ASCII and UTF-8 bodies): the body
    is what json parses, and every message the previous body held is the same object."""
    for ensure_ascii in (True, False):
        previous = None
        msgs = _conversation(0)
        for turn in range(8):
            body = {"model": "m", "messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}],
                    "max_tokens": 5}
            raw = json.dumps(body, ensure_ascii=ensure_ascii).encode()
            got, kept = _parse(raw, previous)
            _same(got, json.loads(raw))
            assert kept is not None and kept.raw is raw and len(kept.ends) == len(msgs)
            if previous is not None:
                old = len(previous.messages)
                assert all(a is b for a, b in zip(got["messages"][:old], previous.messages, strict=True))
            previous = kept
            msgs = [*msgs, {"role": "assistant", "content": f"r{turn}"}, {"role": "user", "content": f"q{turn} ü"}]


def test_reuse_stops_at_the_first_changed_message() -> None:
    msgs = _conversation(4)
    first = json.dumps({"messages": msgs}).encode()
    _, kept = _parse(first, None)
    assert kept is not None
    edited = [*msgs[:3], {**msgs[3], "content": "edited"}, *msgs[4:], {"role": "user", "content": "next"}]
    raw = json.dumps({"messages": edited}).encode()
    got, again = _parse(raw, kept)
    _same(got, json.loads(raw))
    assert all(a is b for a, b in zip(got["messages"][:3], kept.messages[:3], strict=True))
    assert got["messages"][3] is not kept.messages[3]
    assert again is not None and len(again.ends) == len(edited)


def test_a_later_messages_key_wins_as_in_json() -> None:
    """A second ``messages`` key after the array (even an empty one) replaces it, as in json."""
    msgs = _conversation(2)
    _, kept = _parse(json.dumps({"messages": msgs}).encode(), None)
    for later in (b"[]", b'[{"role": "user", "content": "x"}]', b'"text"'):
        raw = json.dumps({"messages": [*msgs, {"role": "user", "content": "more"}]}).encode()[:-1]
        raw += b', "messages": ' + later + b"}"
        got, _ = _parse(raw, kept)
        _same(got, json.loads(raw))


EDGE_SECOND_BODIES = [
    # (what follows the first body's messages, in place of its closing "]}")
    b', {"role": "user", "content": "ok"}]}',
    b' ,\n  {"role": "user", "content": "ok"}\n ] , "stream": false }  ',
    b"]}",
    b", ]}",  # a trailing comma: invalid JSON
    b"]",  # truncated
    b'], "x": 1} trailing',
    b', {"role": "user", "content": "\\ud800 lone"}]}',
    b', {"role": "user", "content": "\xed\xa0\x80 raw surrogate bytes"}]}',
    b', {"role": "user", "content": "bad utf-8 \xff"}]}',
    b', {"role": "user", "n": 123456789012345678901234567890}]}',
    b', {"role": "user", "n": NaN, "m": -Infinity}]}',
    b', ' + b"[" * 5000 + b"]" * 5000 + b"]}",
    b', {"role": "user", "content": "a"} {"role": "user"}]}',
    b', 1, "two", null, [3]]}',
    b', {"role": "user", "content": "x"}], "messages": [], "tools": null}',
]


@pytest.mark.parametrize("suffix", EDGE_SECOND_BODIES)
def test_edge_bodies_parse_or_fail_as_the_full_parser(suffix: bytes) -> None:
    msgs = _conversation(2)
    first = json.dumps({"model": "m", "messages": msgs}).encode()
    _, kept = _parse(first, None)
    assert kept is not None
    raw = first[: kept.ends[-1]] + suffix
    assert _outcome(raw, kept) == _full(raw)
    assert _outcome(raw, None) == _full(raw)


FIRST_BODIES = [
    b'{"messages": []}',
    b'{"messages": "not a list"}',
    b'{"messages": [1, 2], "messages": [{"role": "user", "content": "second"}]}',
    b'{"messages": "x", "messages": [{"role": "user", "content": "second"}]}',
    b"[]",
    b"",
    b"   ",
    b"\xef\xbb\xbf" + b'{"messages": [{"role": "user", "content": "bom"}]}',
    '{"messages": [{"role": "user", "content": "utf16"}]}'.encode("utf-16"),
    b'{"messages": [{"role": "user", "content": "x"}]} {"extra": 1}',
    b'{"a": 1, "a": 2, "messages": [{"role": "user", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": "x"}],}',
    b'{messages: []}',
]


@pytest.mark.parametrize("raw", FIRST_BODIES)
def test_first_bodies_parse_or_fail_as_the_full_parser(raw: bytes) -> None:
    assert _outcome(raw, None) == _full(raw)


def test_random_edits_of_a_resent_body_parse_as_json() -> None:
    """Random byte edits (deletions, insertions, replacements with JSON's own characters)
    of a body that resends the previous one: each parses, or fails, exactly as the full
    parser; the ones that parse and keep a prefix are reused from it."""
    rnd = random.Random(7)
    msgs = _conversation(3)
    first = json.dumps({"model": "m", "messages": msgs, "max_tokens": 9}).encode()
    _, kept = _parse(first, None)
    assert kept is not None
    base = json.dumps({"model": "m", "messages": [*msgs, {"role": "user", "content": "next"}], "max_tokens": 9})
    alphabet = b' ,:[]{}"\\0123456789eE.-+truefalsn\n\xc3\xa9'
    oks = 0
    for _ in range(1500):
        raw = bytearray(base.encode())
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(raw))
            kind = rnd.random()
            if kind < 0.3:
                del raw[at]
            elif kind < 0.6:
                raw.insert(at, rnd.choice(alphabet))
            else:
                raw[at] = rnd.choice(alphabet)
        body = bytes(raw)
        outcome = _outcome(body, kept)
        assert outcome == _full(body), body
        oks += outcome[0] == "ok"
    assert oks > 100  # enough edits kept the body valid to test the reuse path too


def test_the_turn_routes_keep_the_last_body(make_harness: Any) -> None:
    """Over HTTP: a session keeps its last chat body, a second turn reuses its messages, and
    a finished session keeps none."""
    import httpx

    h = make_harness()
    h.push("one", "two")
    sid = h.session()
    s = h.gw.session(sid)
    admin = {"authorization": f"Bearer {h.gw.admin_token}"}
    url = h.server.base_url + "/chat/completions"
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    with httpx.Client(timeout=30) as client:
        r = client.post(url, json={"model": "m", "messages": msgs}, headers={"authorization": f"Bearer {sid}"})
        assert r.status_code == 200, r.text
        first = s.resent
        assert first is not None and len(first.messages) == 1
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "again"}]
        r = client.post(url, json={"model": "m", "messages": msgs}, headers={"authorization": f"Bearer {sid}"})
        assert r.status_code == 200, r.text
        second = s.resent
        assert second is not None and len(second.messages) == 3 and second.messages[0] is first.messages[0]
        assert client.post(h.server.root_url + f"/admin/sessions/{sid}/finish", headers=admin).status_code == 200
    assert s.resent is None

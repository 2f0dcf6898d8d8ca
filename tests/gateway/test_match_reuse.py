"""A resent history costs no per-message work, and reusing the last match changes no row.

Agents resend the whole conversation every turn. The gateway keeps each
session's last match (``Session.matched``) and takes it whole when the request
starts with the same raw messages and the message tree is unchanged
(``core.gateway.history.match_path``); request bodies are parsed with orjson
where that yields what ``json`` would (``core.gateway.app._loads``). These
tests check that the shortcut is taken, and that rows, counters and replies are
identical with and without it over the randomized agents of
``test_trace_properties`` (edits, cut-back histories, sub-agents, concurrent
branches, cancels, aborts, linear and tree mode).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from typing import Any

import pytest

from core.gateway import Gateway, GatewayConfig
from core.gateway.app import _loads
from core.gateway.messages import Unit, Units, openai_units
from core.gateway.turn import TurnRequest
from core.samplers import ScriptedSampler, encode_reply
from core.types import SamplingParams
from tests.gateway.test_trace_properties import Agent, RecordingSampler


def _run(tok: Any, seed: int, reuse: bool) -> list[Any]:
    rnd = random.Random(seed)
    sampler = RecordingSampler(tok, rnd)
    gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig())
    gw.prompts._reuse_matches = reuse

    async def go() -> list[str]:
        agents = []
        for i in range(4):
            sid = gw.create_session(
                sampling=SamplingParams(max_tokens=rnd.choice((6, 32, 32))),
                max_context_tokens=rnd.choice((0, 0, 120, 200)),
                history_mode=rnd.choice(("linear", "tree")),
            )
            agents.append(Agent(gw, sid, rnd, str(i)))
        await asyncio.gather(*(a.run(rnd.randint(6, 14)) for a in agents))
        return [a.sid for a in agents]

    out: list[Any] = []
    for sid in asyncio.run(go()):
        rows = [dataclasses.asdict(r) for r in gw.finish_session(sid)]
        for r in rows:
            r.pop("session_id")
        out.append(rows)
        out.append(dict(gw.session(sid).counters))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_reusing_matches_changes_no_row(byte_tokenizer: Any, seed: int) -> None:
    """Same seed, same agents: rows (tokens, masks, logprobs, spans, metadata) and counters are equal."""
    assert _run(byte_tokenizer, seed, reuse=True) == _run(byte_tokenizer, seed, reuse=False)


def _counting(messages: list[dict[str, Any]], made: list[int]) -> Units:
    units = openai_units(messages)
    make = units._make

    def counted(i: int) -> Unit:
        made.append(i)
        return make(i)

    units._make = counted
    return units


def test_resent_history_is_matched_without_touching_its_messages(byte_tokenizer: Any) -> None:
    """Turn after turn, only the messages new since the last turn become units."""
    tok = byte_tokenizer
    gw = Gateway(
        tokenizer=tok,
        sampler=ScriptedSampler(default=encode_reply(tok, "fine"), tokenizer=tok, record_calls=False),
        config=GatewayConfig(max_context_tokens=0),
    )
    sid = gw.create_session()
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]

    async def go() -> list[list[int]]:
        made_per_turn = []
        for i in range(6):
            history.append({"role": "user", "content": f"question {i}"})
            made: list[int] = []
            msgs = json.loads(json.dumps(history))  # a fresh parse, as each HTTP request is
            out = await gw.run_turn(sid, TurnRequest(units=_counting(msgs, made)))
            history.append({"role": "assistant", "content": out.content})
            made_per_turn.append(sorted(set(made)))
        return made_per_turn

    made_per_turn = asyncio.run(go())
    assert made_per_turn[0] == [0, 1]
    for i, made in enumerate(made_per_turn[1:], start=1):
        # the echoed reply and the new question; the resent history is never wrapped
        assert made == [2 * i, 2 * i + 1], (i, made)
    # one copy of the history's JSON per session: the kept raws are the ones the nodes hold
    matched = gw.session(sid).matched
    assert matched is not None and len(matched.raws) == len(history) - 1
    assert all(r is n.raw for r, n in zip(matched.raws, matched.nodes, strict=True))
    rows = gw.finish_session(sid)
    assert len(rows) == 1 and len(rows[0].turns) == 6
    assert gw.session(sid).counters["full_renders"] == 1


def test_an_edited_history_is_matched_message_by_message(byte_tokenizer: Any) -> None:
    """A request that does not start with the last one's messages falls back to the full match."""
    tok = byte_tokenizer
    gw = Gateway(
        tokenizer=tok,
        sampler=ScriptedSampler(default=encode_reply(tok, "fine"), tokenizer=tok, record_calls=False),
        config=GatewayConfig(max_context_tokens=0),
    )
    sid = gw.create_session(history_mode="tree")
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]

    async def go() -> list[int]:
        out = await gw.run_turn(sid, TurnRequest(units=openai_units(base)))
        second = [*base, {"role": "assistant", "content": out.content}, {"role": "user", "content": "more"}]
        await gw.run_turn(sid, TurnRequest(units=openai_units(second)))
        made: list[int] = []
        edited = [base[0], {"role": "user", "content": "q, edited"}]
        await gw.run_turn(sid, TurnRequest(units=_counting(edited, made)))
        return sorted(set(made))

    assert asyncio.run(go()) == [0, 1]  # the system message matched by comparison, the edit is new
    rows = gw.finish_session(sid)
    assert len(rows) == 2  # the edit forked a row


BODIES = [
    b'{"messages": [{"role": "user", "content": "hi \\u00e9 \\ud83d\\ude00"}], "max_tokens": 5}',
    b'{"tools": [{"function": {"name": "f", "parameters": {"maximum": 18446744073709551616}}}]}',
    b'{"tools": [{"function": {"name": "f", "parameters": {"minimum": -9223372036854775809}}}]}',
    b'{"temperature": 0.7, "top_p": 1e-3, "n": 1, "x": [1.5, -0, 2E2, true, false, null]}',
    b'{"content": "a run of digits 12345678901234567890 in text"}',
    b'{"a": 1, "a": 2}',
    b'{"t": NaN, "u": Infinity, "v": 1e400}',
    b'{"s": "\\ud800 lone"}',
    b"\xef\xbb\xbf{}",
    '{"utf16": 1}'.encode("utf-16"),
]


@pytest.mark.parametrize("raw", BODIES)
def test_body_parse_matches_json(raw: bytes) -> None:
    """orjson where it agrees with ``json``; ``json`` itself otherwise (big integers stay exact)."""
    got, want = _loads(raw), json.loads(raw)
    assert repr(got) == repr(want)  # repr: int vs float and NaN are told apart
    assert json.dumps(got) == json.dumps(want)


def test_body_parse_refuses_what_json_refuses() -> None:
    for raw in (b'{"a": ', b"[" * 5000 + b"]" * 5000, b'{"a": 1} x'):
        with pytest.raises((ValueError, RecursionError)):
            json.loads(raw)
        with pytest.raises((ValueError, RecursionError)):
            _loads(raw)


def _branchy_linear_session(tok: Any, reuse: bool) -> tuple[list[Any], dict[str, int]]:
    """Linear mode, two concurrent turns on one history (the newest branch wins the chain),
    then the older branch continued, then the chain's branch continued."""
    gw = Gateway(
        tokenizer=tok,
        sampler=ScriptedSampler(default=encode_reply(tok, "ok"), tokenizer=tok, record_calls=False, delay_s=0.001),
        config=GatewayConfig(max_context_tokens=0),
    )
    gw.prompts._reuse_matches = reuse
    sid = gw.create_session(history_mode="linear")
    h = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]

    async def turn(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = await gw.run_turn(sid, TurnRequest(units=openai_units(json.loads(json.dumps(msgs)))))
        return [*msgs, {"role": "assistant", "content": out.content}]

    async def go() -> None:
        h1 = await turn(h)
        x, z = await asyncio.gather(
            turn([*h1, {"role": "user", "content": "x"}]), turn([*h1, {"role": "user", "content": "z"}])
        )
        await turn([*x, {"role": "user", "content": "y"}])  # off the chain (z's branch is newest)
        await turn([*z, {"role": "user", "content": "w"}])  # the chain's own branch: still linear

    asyncio.run(go())
    rows = [dataclasses.asdict(r) for r in gw.finish_session(sid)]
    for r in rows:
        r.pop("session_id")
    return rows, dict(gw.session(sid).counters)


def test_linear_chain_length_is_kept_right_off_the_chain(byte_tokenizer: Any) -> None:
    """A turn recorded off the newest branch does not move the chain's end (no spurious reset)."""
    with_reuse = _branchy_linear_session(byte_tokenizer, reuse=True)
    assert with_reuse == _branchy_linear_session(byte_tokenizer, reuse=False)
    assert with_reuse[1]["nonlinear_resets"] == 0

"""Hostile input: one request cannot stall the others, client input never gets a 5xx,
slow clients cannot hold connections, memory stays bounded (issue #15).

Everything runs against the real gateway on uvicorn (``conftest.make_harness``);
only the model is scripted. Raw sockets stand in for misbehaving clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.gateway import GatewayConfig
from core.gateway.render import ANCHOR_CACHE_CHARS, ANCHOR_CACHE_ENTRIES, ChatRenderer, ServedTurn
from core.gateway.toolparse import parse_hermes, parse_llama3_json, parse_qwen3_coder
from core.samplers import ScriptedSampler, encode_reply
from core.types import SamplingParams
from tests.gateway.conftest import CALC_TOOL, Harness

ANTH_TOOL = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def _post(h: Harness, path: str, sid: str, body: bytes | dict[str, Any], timeout: float = 60) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        h.server.root_url + path, content=content, timeout=timeout,
        headers={"authorization": f"Bearer {sid}", "content-type": "application/json"},
    )


def _chat(text: str = "hi") -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}]}


def _anth(text: str = "hi") -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}


def _openai_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["type"], body
    return str(body["error"]["message"])


def _anthropic_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"], body
    return str(body["error"]["message"])


# ----------------------------------------------------------------------------- 1. one request cannot stall the rest


def _default_harness(make_harness: Any, byte_tokenizer: Any, **config: Any) -> Harness:
    sampler = ScriptedSampler(default=encode_reply(byte_tokenizer, "ok"), tokenizer=byte_tokenizer,
                              record_calls=False)
    h: Harness = make_harness(GatewayConfig(**config), sampler=sampler)
    return h


class _LoopLag:
    """A probe on the gateway's event loop: a task that sleeps 5 ms again and again and
    records how late each sleep woke (``(woke_at, lateness)``, perf_counter seconds). A
    callback that holds the loop shows up as one wake-up late by as long as it held it,
    whatever else the machine runs: a loaded machine makes every wake-up a little late, not
    one of them seconds late."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._done = asyncio.run_coroutine_threadsafe(self._run(), loop)

    async def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            woke = time.perf_counter()
            self.samples.append((woke, woke - t0 - 0.005))

    def stop(self) -> None:
        self._stop.set()
        self._done.result(60)

    def worst(self, start: float, end: float) -> float:
        """The latest wake-up among those due between ``start`` and ``end``."""
        return max((lag for woke, lag in self.samples if start < woke - lag and woke - lag < end), default=0.0)


def test_a_huge_prompt_slows_only_itself(make_harness: Any, byte_tokenizer: Any) -> None:
    """A 1 MB count_tokens request of an unlimited session is tokenized (seconds with this
    tokenizer) while other sessions run turns back to back. Neither the gateway's event loop
    nor any other session's turn is held for a quarter of the huge request's time: a probe
    task on the loop (``_LoopLag``) never wakes that late, and no turn takes that long.

    Both bounds are fractions of the huge request's own time, measured in the same run, so
    machine load (which slows both sides) does not move them. Before the fix the request
    held the loop for the whole tokenization: the probe's worst wake-up and the turn in
    flight were late by about the request's whole time (a ratio near 1, against 0.25 here).
    """
    # The small sessions run turns for as long as the huge request lasts, which on a fast
    # machine is more than the default 1024 turns of one session (0: no cap).
    h = _default_harness(make_harness, byte_tokenizer, max_turns_per_session=0)
    sids = [h.session() for _ in range(4)]
    huge_sid = h.session(max_context_tokens=0)
    huge = {"model": "tiny", "messages": [{"role": "user", "content": "lorem ipsum " * 90_000}]}
    url = h.server.base_url + "/chat/completions"

    async def run() -> tuple[list[float], float, float, int]:
        async with httpx.AsyncClient(timeout=120) as client:

            async def turn(sid: str) -> float:
                t0 = time.perf_counter()
                r = await client.post(url, json=_chat(), headers={"authorization": f"Bearer {sid}"})
                assert r.status_code == 200, r.text
                return time.perf_counter() - t0

            async def turns(sid: str, until: Any) -> list[float]:
                """Latencies of turns of ``sid`` sent back to back until ``until()``."""
                out = []
                while not until():
                    out.append(await turn(sid))
                return out

            await asyncio.gather(*(turn(sid) for sid in sids))  # warm-up
            started = time.perf_counter()
            big = asyncio.create_task(
                client.post(h.server.root_url + "/v1/messages/count_tokens", json=huge,
                            headers={"x-api-key": huge_sid})
            )
            during = await asyncio.gather(*(turns(sid, big.done) for sid in sids))
            r = await big
            ended = time.perf_counter()
            assert r.status_code == 200, r.text
            return [t for ts in during for t in ts], started, ended, r.json()["input_tokens"]

    probe = _LoopLag(h.loop)
    try:
        during, started, ended, counted = asyncio.run(run())
    finally:
        probe.stop()
    big_s = ended - started
    assert counted > 500_000  # it really was tokenized, at about one token per two characters
    assert probe.samples and during, "the probe or the other sessions' turns never ran"
    worst_lag, worst_turn = probe.worst(started, ended), max(during)
    assert worst_lag < big_s / 4, (
        f"the gateway's event loop was held for {worst_lag:.2f} s of the huge request's {big_s:.2f} s"
    )
    assert worst_turn < big_s / 4, (
        f"a turn of another session took {worst_turn:.2f} s of the huge request's {big_s:.2f} s "
        f"({len(during)} turns during it)"
    )
    assert big_s > 0.5, f"the huge request took only {big_s:.2f} s: too short to measure against"


def test_oversized_prompt_is_refused_before_tokenizing(make_harness: Any, byte_tokenizer: Any) -> None:
    """A 7 MB body against the default 4096-token budget: 400 context_length_exceeded within
    seconds on chat, messages and count_tokens (tokenizing it takes about 20 s here)."""
    h = _default_harness(make_harness, byte_tokenizer)
    sid = h.session()
    text = "lorem ipsum " * 580_000
    t0 = time.perf_counter()
    msg = _openai_error(_post(h, "/v1/chat/completions", sid, _chat(text)), 400)
    assert "maximum context length is 4096 tokens" in msg and "at least" in msg
    msg = _anthropic_error(_post(h, "/v1/messages", sid, _anth(text)), 400)
    assert msg.startswith("prompt is too long")
    r = _post(h, "/v1/messages/count_tokens", sid, {"messages": [{"role": "user", "content": text}]})
    assert "prompt is too long" in _anthropic_error(r, 400)
    assert time.perf_counter() - t0 < 10
    assert h.gw.session(sid).counters["context_length_exceeded"] == 3
    assert h.gw.session(sid).turns == []


def test_the_length_bound_never_refuses_a_prompt_that_fits(byte_tokenizer: Any) -> None:
    """The bound is a true lower bound: texts of the densest tokens (the longest vocabulary
    strings, special tokens) still count at or above it, so a fitting prompt is never refused."""
    r = ChatRenderer(byte_tokenizer)
    assert r.max_token_chars is not None
    longest = max(byte_tokenizer.get_vocab(), key=len)
    for text in [longest * 500, "<|im_end|>" * 300, "a" * 1000, "🙂" * 400, "中文 " * 300, ""]:
        assert r.min_tokens(text) <= len(r.encode(text)), text[:20]
    ids = r.render_prompt([{"role": "user", "content": longest * 100}], None)
    assert r.render_prompt([{"role": "user", "content": longest * 100}], None, limit=len(ids)) == ids


def test_count_tokens_has_the_turn_budget(make_harness: Any, byte_tokenizer: Any) -> None:
    h = _default_harness(make_harness, byte_tokenizer)
    sid = h.session(max_context_tokens=64)
    ok = _post(h, "/v1/messages/count_tokens", sid, {"messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200 and 0 < ok.json()["input_tokens"] < 64
    r = _post(h, "/v1/messages/count_tokens", sid, {"messages": [{"role": "user", "content": "word " * 200}]})
    assert "maximum context length is 64 tokens" in _anthropic_error(r, 400)


# ----------------------------------------------------------------------------- 2. no 5xx from client input or model output


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_deeply_nested_tool_call_from_the_model_is_an_ill_formed_turn(harness: Harness, dialect: str) -> None:
    """The reply is kept in the trace and counted ill-formed; the client gets 200 and can go on."""
    h = harness
    sid = h.session(sampling=SamplingParams(max_tokens=20_000), max_context_tokens=0)
    reply = '<tool_call>{"name": "calculator", "arguments": {"x": ' + _nested(5000) + "}}</tool_call>"
    h.push(reply, "fine")
    if dialect == "openai":
        body: dict[str, Any] = {**_chat("go"), "tools": [CALC_TOOL]}
        r = _post(h, "/v1/chat/completions", sid, body)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message["content"] == reply and not message.get("tool_calls")
        body["messages"] += [message, {"role": "user", "content": "again"}]
        r2 = _post(h, "/v1/chat/completions", sid, body)
    else:
        body = {**_anth("go"), "max_tokens": 20_000, "tools": [ANTH_TOOL]}
        r = _post(h, "/v1/messages", sid, body)
        assert r.status_code == 200, r.text
        assert r.json()["content"] == [{"type": "text", "text": reply}]
        body["messages"] += [{"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
        r2 = _post(h, "/v1/messages", sid, body)
    assert r2.status_code == 200, r2.text
    rows = h.call(h.gw.peek_rows, sid)
    assert len(rows) == 1 and rows[0].metadata["row_turns"] == 2  # the second turn extends the first
    assert rows[0].metadata["ill_formed_tool_calls"] == 1 and rows[0].metadata["ill_formed_turns"] == 1
    generated = h.reply(reply)
    first = rows[0].turns[0]
    assert rows[0].token_ids[first.start : first.end] == generated
    assert sum(rows[0].loss_mask[first.start : first.end]) == len(generated)


def test_parsers_survive_deep_json() -> None:
    deep = _nested(5000)
    mid = _nested(200)  # parses in Python, but deeper than the gateway accepts
    for arguments in (deep, mid):
        out = parse_hermes(f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>')
        assert out.ill_formed and not out.tool_calls
        out = parse_hermes(f'<tool_call>{{"name": "f", "arguments": {json.dumps(arguments)}}}</tool_call>')
        assert out.ill_formed and not out.tool_calls
        out = parse_llama3_json(f'{{"name": "f", "parameters": {{"x": {arguments}}}}}')
        assert out.ill_formed and not out.tool_calls
        out = parse_qwen3_coder(f"<tool_call>\n<function=f>\n<parameter=x>\n{arguments}\n</parameter>\n</function>\n</tool_call>")
        assert not out.ill_formed and out.tool_calls == [("f", {"x": arguments})]  # kept as text


def test_client_tool_call_arguments_nested_deep_are_400(harness: Harness) -> None:
    h = harness
    sid = h.session()
    for depth in (5000, 200):
        call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": _nested(depth)}}
        body = {"model": "tiny", "tools": [CALC_TOOL], "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
        ]}
        r = _post(h, "/v1/chat/completions", sid, body)
        msg = _openai_error(r, 400)
        assert "messages[1].tool_calls[0].function.arguments" in msg and "nested more than 128" in msg


@pytest.mark.parametrize("depth", [5000, 990, 975, 970, 965, 960, 900])
def test_deep_client_json_is_never_a_5xx(harness: Harness, depth: int) -> None:
    """Nesting around Python's parser limit, where parsing succeeds but later recursive steps
    (matching, the template's tojson, encoders) run a few frames deeper: 200 or a 400 in the
    dialect's envelope, never a 5xx; beyond the parser's limit always a 400 naming the nesting."""
    h = harness
    inner = _nested(depth)
    use = '{"type": "tool_use", "id": "t", "name": "calculator", "input": {"x": ' + inner + "}}"
    anth_msgs = ('[{"role": "user", "content": "go"}, {"role": "assistant", "content": [' + use + "]}, "
                 '{"role": "user", "content": "more"}]')
    call = '{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": ' + inner + "}}}"
    cases = [
        ("/v1/messages", True, '{"max_tokens": 8, "messages": ' + anth_msgs + "}"),
        ("/v1/messages/count_tokens", True, '{"messages": ' + anth_msgs + "}"),
        ("/v1/messages", True, '{"max_tokens": 8, "tools": [{"name": "f", "input_schema": {"x": ' + inner
         + '}}], "messages": [{"role": "user", "content": "go"}]}'),
        ("/v1/chat/completions", False, '{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", '
         '"content": null, "tool_calls": [' + call + ']}, {"role": "tool", "tool_call_id": "c", "content": "1"}]}'),
        ("/v1/chat/completions", False, '{"tools": [{"type": "function", "function": {"name": "f", "parameters": '
         '{"x": ' + inner + '}}}], "messages": [{"role": "user", "content": "go"}]}'),
        ("/v1/chat/completions", False, '{"chat_template_kwargs": {"x": ' + inner + '}, '
         '"messages": [{"role": "user", "content": "go"}]}'),
    ]
    for path, anthropic, raw in cases:
        h.push("ok")
        r = _post(h, path, h.session(max_context_tokens=0), raw.encode())
        assert r.status_code in (200, 400), (path, r.status_code, r.text[:300])
        if r.status_code == 400:
            msg = _anthropic_error(r, 400) if anthropic else _openai_error(r, 400)
            assert "nests" in msg or "deep" in msg or "Recursion" in msg, msg
        if depth == 5000:
            assert r.status_code == 400 and "deeper than Python's parser allows" in r.text


DEEP_FIELDS = [("/v1/chat/completions", f) for f in (
    "logit_bias", "tool_choice", "seed", "n", "stream_options", "stop", "reasoning_effort", "top_logprobs",
    "parallel_tool_calls", "temperature",
)] + [("/v1/messages", f) for f in ("mcp_servers", "thinking", "tool_choice", "top_k", "stop_sequences")]


def test_deep_values_of_request_fields_are_400_naming_the_field(harness: Harness) -> None:
    """A field's value nested just under the parser's limit is a 400 naming the field: error
    messages quote values without ``repr`` of the whole (which recursed into a 500)."""
    h = harness
    sid = h.session()
    for path, field in DEEP_FIELDS:
        body = '{"max_tokens": 8, "messages": [{"role": "user", "content": "go"}], "' + field + '": ' + _nested(990) + "}"
        r = _post(h, path, sid, body.encode())
        msg = _anthropic_error(r, 400) if path == "/v1/messages" else _openai_error(r, 400)
        assert field in msg, (field, msg)
    deep = _nested(990)
    for path, raw, where in (
        ("/v1/chat/completions", '{"messages": [{"role": ' + deep + ', "content": "x"}]}', "messages[0].role"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": ' + deep + "}]}]}",
         "messages[0].content[0]"),
        ("/v1/messages", '{"max_tokens": 8, "messages": [{"role": ' + deep + ', "content": "x"}]}', "messages[0].role"),
        ("/v1/messages", '{"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": ' + deep + "}]}]}",
         "messages[0].content[0]"),
        ("/v1/messages", '{"max_tokens": 8, "tools": [{"name": "f", "type": ' + deep + '}], '
         '"messages": [{"role": "user", "content": "x"}]}', "tools[0]"),
        ("/v1/messages", '{"max_tokens": 8, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", '
         '"content": [{"type": "tool_use", "id": ' + deep + ', "name": "f", "input": {}}]}, '
         '{"role": "user", "content": "b"}]}', "messages[1].content[0].id"),
        ("/v1/messages", '{"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", '
         '"tool_use_id": ' + deep + ', "content": "x"}]}]}', "messages[0].content[0].tool_use_id"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
         '"function": {"name": "f"}}], "tool_choice": {"type": ' + deep + "}}", "'tool_choice' of type"),
        ("/v1/responses", '{"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": '
         + deep + "}}", "'tool_choice' of type"),
    ):
        r = _post(h, path, sid, raw.encode())
        msg = _anthropic_error(r, 400) if path == "/v1/messages" else _openai_error(r, 400)
        assert where in msg, (where, msg)
    assert h.sampler.calls == []


LONE = '"a \\ud800 b"'  # the JSON text of a string holding a lone high surrogate


@pytest.mark.parametrize("surrogate", [LONE, '"\\udfff"', '"x\\ud83d"'])
def test_lone_surrogates_are_400_in_both_dialects(harness: Harness, surrogate: str) -> None:
    h = harness
    sid = h.session()
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": ' + surrogate.encode() + b"}]}"
    msg = _openai_error(_post(h, "/v1/chat/completions", sid, raw), 400)
    assert "messages[0].content" in msg and "surrogate" in msg
    anth = b'{"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": ' + surrogate.encode() + b"}]}"
    assert "surrogate" in _anthropic_error(_post(h, "/v1/messages", sid, anth), 400)
    assert "surrogate" in _anthropic_error(_post(h, "/v1/messages/count_tokens", sid, anth), 400)
    system = b'{"max_tokens": 8, "system": ' + surrogate.encode() + b', "messages": [{"role": "user", "content": "x"}]}'
    assert "system" in _anthropic_error(_post(h, "/v1/messages/count_tokens", sid, system), 400)
    later = (b'{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}, '
             b'{"role": "user", "content": [{"type": "text", "text": ' + surrogate.encode() + b"}]}]}")
    assert "messages[2].content[0].text" in _openai_error(_post(h, "/v1/chat/completions", sid, later), 400)
    stop = b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a", ' + surrogate.encode() + b"]}"
    assert "stop[1]" in _openai_error(_post(h, "/v1/chat/completions", sid, stop), 400)
    stop = b'{"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "stop_sequences": [' + surrogate.encode() + b"]}"
    assert "stop_sequences[0]" in _anthropic_error(_post(h, "/v1/messages", sid, stop), 400)
    assert h.gw.session(sid).turns == []


def test_lone_surrogate_in_a_continuation_turn_is_400(harness: Harness) -> None:
    """The tail render (a turn that extends a served one) refuses it the same way."""
    h = harness
    sid = h.session()
    h.push("ok", "ok")
    first = _chat("go")
    r = _post(h, "/v1/chat/completions", sid, first)
    assert r.status_code == 200
    raw = json.dumps({"messages": [*first["messages"], r.json()["choices"][0]["message"]]})
    raw = raw[:-2] + ', {"role": "user", "content": "\\udc00 then"}]}'
    msg = _openai_error(_post(h, "/v1/chat/completions", sid, raw.encode()), 400)
    assert "messages[2].content" in msg and "surrogate" in msg
    assert len(h.gw.session(sid).turns) == 1


def test_escaped_surrogate_pairs_are_fine(harness: Harness) -> None:
    h = harness
    sid = h.session()
    h.push("ok")
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "smile \\ud83d\\ude00 \\\\ud800"}]}'
    assert _post(h, "/v1/chat/completions", sid, raw).status_code == 200
    r = _post(h, "/v1/messages/count_tokens", sid, b'{"messages": [{"role": "user", "content": "\\uD83D\\uDE00"}]}')
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_template_refusal_is_400(make_harness: Any, byte_tokenizer: Any) -> None:
    tok = copy.deepcopy(byte_tokenizer)
    tok.chat_template = (
        "{%- if messages[0].role != 'system' %}{{ raise_exception('the first message must be a system message') }}"
        "{%- endif %}" + byte_tokenizer.chat_template
    )
    h = make_harness(tokenizer=tok)
    sid = h.session()
    msg = _openai_error(_post(h, "/v1/chat/completions", sid, _chat()), 400)
    assert "first message must be a system message" in msg
    r = _post(h, "/v1/messages/count_tokens", sid, {"messages": [{"role": "user", "content": "x"}]})
    assert "chat template" in _anthropic_error(r, 400)


# ----------------------------------------------------------------------------- 3. slow and idle clients


def _raw_request(path: str, sid: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {sid}\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    ).encode()


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


@contextlib.contextmanager
def gateway_log() -> Iterator[list[str]]:
    """Warnings of the gateway and of uvicorn (whose logger does not propagate to caplog).
    Enter it after the server started: uvicorn's logging config replaces its loggers' handlers."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    loggers = [logging.getLogger("core.gateway"), logging.getLogger("uvicorn.error")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield lines
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"])
def test_a_stalled_body_gets_408_and_the_connection_closes(make_harness: Any, path: str) -> None:
    h = make_harness(GatewayConfig(body_read_timeout_s=0.5))
    sid = h.session()
    with gateway_log() as log, socket.create_connection(("127.0.0.1", h.server.port), timeout=10) as sock:
        sock.sendall(_raw_request(path, sid, 100) + b'{"messages": ')
        t0 = time.perf_counter()
        data = _read_all(sock)  # returns once the server closed the connection
        waited = time.perf_counter() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"gateway.body_read_timeout_s" in data
    assert 0.4 < waited < 5
    assert any("gateway.body_read_timeout_s" in line and "408" in line for line in log), log
    # the gateway still serves
    h.push("ok")
    assert _post(h, "/v1/chat/completions", sid, _chat()).status_code == 200


def test_a_stalled_admin_body_gets_408(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(body_read_timeout_s=0.5))
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=10) as sock:
        sock.sendall(_raw_request("/admin/sessions", h.server.admin_token, 50) + b'{"metadata": ')
        data = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert h.gw.sessions() == []


def test_a_trickled_body_cannot_outlast_the_timeout(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(body_read_timeout_s=1.0))
    sid = h.session()
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=10) as sock:
        sock.sendall(_raw_request("/v1/chat/completions", sid, 1000))
        t0 = time.perf_counter()
        sock.settimeout(0.2)
        data = b""
        while time.perf_counter() - t0 < 6:
            sock.sendall(b" ")  # one byte every 0.2 s: never idle, never done
            try:
                data += sock.recv(65536)
            except TimeoutError:
                continue
            if data:
                break
        waited = time.perf_counter() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert waited < 3


def test_the_connection_cap_answers_503_and_says_why(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(max_connections=4))
    sid = h.session()
    # Kept-alive connections whose request was served count (those still sending headers do not)
    idle: list[socket.socket] = []
    try:
        for _ in range(4):
            idle.append(socket.create_connection(("127.0.0.1", h.server.port), timeout=10))
            idle[-1].sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            idle[-1].recv(4096)  # 200 until the harness's own connection and these fill the cap
        time.sleep(0.2)
        with gateway_log() as log:
            r = _post(h, "/v1/chat/completions", sid, _chat())
        assert r.status_code == 503
        assert any("gateway.max_connections" in line for line in log), log
    finally:
        for s in idle:
            s.close()
    h.push("ok")
    deadline = time.perf_counter() + 5
    while True:  # the server notices the closed sockets on its next loop iterations
        r = _post(h, "/v1/chat/completions", sid, _chat())
        if r.status_code == 200 or time.perf_counter() > deadline:
            break
        time.sleep(0.05)
    assert r.status_code == 200


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n", b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /hea"],
    ids=["nothing", "half-headers", "second-request-half-sent"],
)
def test_connections_without_complete_headers_are_closed(make_harness: Any, sent: bytes) -> None:
    h = make_harness(GatewayConfig(header_read_timeout_s=1.0, keep_alive_timeout_s=60))
    with gateway_log() as log, socket.create_connection(("127.0.0.1", h.server.port), timeout=10) as sock:
        sock.sendall(sent)
        t0 = time.perf_counter()
        data = _read_all(sock)  # returns once the server closed the connection
        waited = time.perf_counter() - t0
    assert 0.9 < waited < 4, waited
    assert data.startswith(b"HTTP/1.1 200") == (b"/health" in sent)
    assert any("gateway.header_read_timeout_s" in line for line in log), log


def test_idle_keep_alive_connections_are_closed(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(keep_alive_timeout_s=1))
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        t0 = time.perf_counter()
        data = _read_all(sock)
        waited = time.perf_counter() - t0
    assert data.startswith(b"HTTP/1.1 200") and 0.8 < waited < 5


# ----------------------------------------------------------------------------- 4. bounded memory


def test_anchor_cache_hits_equal_tools_and_stays_bounded(byte_tokenizer: Any) -> None:
    r = ChatRenderer(byte_tokenizer)
    anchors = 0
    render_text = r.render_text

    def counting(messages: Any, tools: Any, *, add_generation_prompt: bool) -> str:
        nonlocal anchors
        anchors += not add_generation_prompt  # only the anchor is rendered without the prompt
        return render_text(messages, tools, add_generation_prompt=add_generation_prompt)

    r.render_text = counting  # type: ignore[method-assign]
    tail = [{"role": "user", "content": "next"}]
    for _ in range(300):  # every request parses its own, equal, tools
        r.render_continuation(tail, json.loads(json.dumps([CALC_TOOL])), ServedTurn("<|im_end|>"))
    assert anchors == 1 and r.anchor_cache_size()[0] == 1
    big = "x" * 200_000
    for i in range(300):
        tools = [{"type": "function", "function": {"name": f"t{i}", "description": big if i % 2 else "d"}}]
        r.render_continuation(tail, tools, ServedTurn("<|im_end|>"))
        entries, chars = r.anchor_cache_size()
        assert entries <= ANCHOR_CACHE_ENTRIES and chars <= ANCHOR_CACHE_CHARS
    variants = [[{"type": "function", "function": {"name": "same", "description": str(i)}}] for i in range(50)]
    for tools in variants:
        r.render_continuation(tail, tools, ServedTurn("<|im_end|>"))
    assert r.anchor_cache_size()[0] <= ANCHOR_CACHE_ENTRIES


def test_turns_per_session_are_capped(make_harness: Any, byte_tokenizer: Any) -> None:
    h = _default_harness(make_harness, byte_tokenizer, max_turns_per_session=3)
    sid = h.session()
    for _ in range(3):
        assert _post(h, "/v1/chat/completions", sid, _chat()).status_code == 200
    r = _post(h, "/v1/chat/completions", sid, _chat())
    msg = _openai_error(r, 400)
    assert r.json()["error"]["code"] == "session_turn_limit" and "gateway.max_turns_per_session" in msg
    assert "3 turns" in _anthropic_error(_post(h, "/v1/messages", sid, _anth()), 400)
    assert len(h.gw.session(sid).turns) == 3
    assert _post(h, "/v1/chat/completions", h.session(), _chat()).status_code == 200  # other sessions go on


def test_stop_strings_per_request_are_capped(make_harness: Any, byte_tokenizer: Any) -> None:
    h = _default_harness(make_harness, byte_tokenizer, max_stop_strings=4)
    sid = h.session()
    assert _post(h, "/v1/chat/completions", sid, {**_chat(), "stop": ["a", "b", "c", "d"]}).status_code == 200
    msg = _openai_error(_post(h, "/v1/chat/completions", sid, {**_chat(), "stop": list("abcde")}), 400)
    assert "'stop' holds 5 stop strings" in msg and "gateway.max_stop_strings" in msg
    r = _post(h, "/v1/messages", sid, {**_anth(), "stop_sequences": [str(i) for i in range(1000)]})
    assert "'stop_sequences' holds 1000" in _anthropic_error(r, 400)


def test_admin_bodies_are_capped(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(max_admin_body_bytes=100_000))
    admin = {"authorization": f"Bearer {h.server.admin_token}"}
    url = h.server.root_url + "/admin/sessions"
    ok = httpx.post(url, headers=admin, json={"metadata": {"note": "x" * 1000}})
    assert ok.status_code == 200
    big = httpx.post(url, headers=admin, json={"metadata": {"blob": "x" * 9_000_000}}, timeout=60)
    assert big.status_code == 413 and "gateway.max_admin_body_bytes" in big.json()["error"]["message"]
    assert len(h.gw.sessions()) == 1


def test_admin_bodies_are_capped_by_default(harness: Harness) -> None:
    admin = {"authorization": f"Bearer {harness.server.admin_token}"}
    r = httpx.post(harness.server.root_url + "/admin/sessions", headers=admin,
                   json={"metadata": {"blob": "x" * 9_000_000}}, timeout=60)
    assert r.status_code == 413
    bad = httpx.post(harness.server.root_url + "/admin/sessions", headers=admin,
                     content=b'{"metadata": {"k": "\\ud800"}}')
    assert bad.status_code == 400


def test_threads_used_by_large_renders_are_the_gateways(make_harness: Any, byte_tokenizer: Any) -> None:
    """Large renders run in the gateway's own small pool, not the loop thread."""
    h = _default_harness(make_harness, byte_tokenizer, render_offload_chars=1000)
    seen: list[str] = []
    encode = h.gw.renderer.encode

    def spy(text: str) -> list[int]:
        seen.append(threading.current_thread().name)
        return encode(text)

    h.gw.renderer.encode = spy  # type: ignore[method-assign]
    sid = h.session()
    assert _post(h, "/v1/chat/completions", sid, _chat("small")).status_code == 200
    assert _post(h, "/v1/chat/completions", sid, _chat("large " * 400)).status_code == 200
    assert not seen[0].startswith("tracerl-gateway-render") and seen[1].startswith("tracerl-gateway-render")

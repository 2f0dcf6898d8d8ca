"""Every top-level request field is honoured, harmless to ignore, or refused with a 400 naming it.

The field lists come from the official SDKs' own typed request params, so a field
a new SDK release adds fails ``test_every_sdk_field_is_classified`` until it is
classified in ``core.gateway.fields`` (or, for Responses, ``responses_api``).
Most checks call the dialect parsers directly (cheap); one test goes over HTTP
to check the escape hatch ``gateway.ignore_request_fields`` end to end.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import warnings
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import message_create_params
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from core.errors import ConfigError
from core.gateway import GatewayConfig
from core.gateway.anthropic_api import parse_count_request, parse_messages_request
from core.gateway.errors import GatewayError
from core.gateway.fields import ANTHROPIC_FIELDS, CHAT_FIELDS, Fields
from core.gateway.openai_api import parse_chat_request
from core.gateway.reasoning_switches import ReasoningSwitches
from core.gateway.responses_api import _NO_EFFECT, _USED, parse_responses_request
from core.types import SamplingParams
from tests.gateway.conftest import Harness


def _sdk_fields(*classes: type) -> set[str]:
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            names |= set(getattr(klass, "__annotations__", {}))
    return names


CHAT_SDK = _sdk_fields(
    completion_create_params.CompletionCreateParamsStreaming, completion_create_params.CompletionCreateParamsNonStreaming
)
ANTHROPIC_SDK = _sdk_fields(
    message_create_params.MessageCreateParamsStreaming, message_create_params.MessageCreateParamsNonStreaming
)
RESPONSES_SDK = _sdk_fields(
    response_create_params.ResponseCreateParamsStreaming, response_create_params.ResponseCreateParamsNonStreaming
)
RESPONSES_REFUSED = {"access_programs", "background_options", "context_management", "conversation", "image",
                     "moderation", "prompt"}
"""Responses fields the SDK lists that the gateway refuses (its field list is closed)."""

USER = [{"role": "user", "content": "hi"}]


def _classes(fields: Fields) -> set[str]:
    return set(fields.read) | set(fields.harmless) | set(fields.unhonoured)


@pytest.mark.parametrize(
    ("dialect", "sdk", "known"),
    [
        ("chat", CHAT_SDK, _classes(CHAT_FIELDS)),
        ("anthropic", ANTHROPIC_SDK, _classes(ANTHROPIC_FIELDS)),
        ("responses", RESPONSES_SDK, set(_USED) | set(_NO_EFFECT) | RESPONSES_REFUSED),
    ],
)
def test_every_sdk_field_is_classified(dialect: str, sdk: set[str], known: set[str]) -> None:
    """A field the SDK can send and the gateway has not classified would be refused as unknown;
    this fails first so that someone decides (docs/gateway.md, Request fields)."""
    assert len(sdk) > 15, sdk  # the SDK's params were read
    missing = sorted(sdk - known)
    assert not missing, f"{dialect}: classify {missing} in core/gateway/fields.py and docs/gateway.md"


def test_classes_do_not_overlap() -> None:
    for fields in (CHAT_FIELDS, ANTHROPIC_FIELDS):
        assert not fields.read & fields.harmless
        assert not (fields.read | fields.harmless) & set(fields.unhonoured)
    assert not _USED & _NO_EFFECT


# ---------------------------------------------------------------- unknown and unhonoured fields

def _same(parsed: Any) -> Any:
    """A parse result comparable with ``==`` (units by their canonical messages)."""
    req, *rest = parsed
    return dataclasses.replace(req, units=[m for u in req.units for m in u.canon()]), *rest


def _chat(body: dict[str, Any]) -> Any:
    return parse_chat_request({"messages": USER, **body})


def _messages(body: dict[str, Any]) -> Any:
    return parse_messages_request({"messages": USER, "max_tokens": 64, **body})


def _count(body: dict[str, Any]) -> Any:
    return parse_count_request({"messages": USER, **body})


def _responses(body: dict[str, Any]) -> Any:
    return parse_responses_request({"input": "hi", **body}, {})


PARSERS = {"chat": _chat, "messages": _messages, "count_tokens": _count, "responses": _responses}


@pytest.mark.parametrize("route", sorted(PARSERS))
def test_unknown_fields_are_refused_naming_the_field_and_the_escape_hatch(route: str) -> None:
    with pytest.raises(GatewayError) as exc:
        PARSERS[route]({"frobnicate": 1})
    err = exc.value
    assert err.status == 400 and err.param == "frobnicate" and "'frobnicate'" in err.message
    if route != "responses":
        assert "gateway.ignore_request_fields" in err.message
    with pytest.raises(GatewayError) as exc:
        PARSERS[route]({"k" * 10_000: 1})  # a hostile name is quoted cut short
    assert len(exc.value.message) < 1000 and exc.value.param is not None and len(exc.value.param) <= 60
    PARSERS[route]({"frobnicate": None})  # null counts as absent


HARMLESS_VALUES: dict[str, Any] = {
    "model": "anything", "user": "u1", "metadata": {"k": "v"}, "store": True, "service_tier": "flex",
    "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"},
    "safety_identifier": "s", "prediction": {"type": "content", "content": "x"},
    "cache_control": {"type": "ephemeral"}, "inference_geo": "us", "speed": "fast", "workspace_id": "w",
    "user_profile_id": "p", "diagnostics": {"previous_message_id": "msg_1"},
}


@pytest.mark.parametrize(("route", "fields"), [("chat", CHAT_FIELDS), ("messages", ANTHROPIC_FIELDS)])
def test_harmless_fields_change_nothing(route: str, fields: Fields) -> None:
    """Each harmless field, set, yields the same turn request as without it."""
    plain = _same(PARSERS[route]({}))
    for name in sorted(fields.harmless):
        assert _same(PARSERS[route]({name: HARMLESS_VALUES[name]})) == plain, name


REFUSED_VALUES: dict[str, Any] = {
    "frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"42": 5}, "response_format": {"type": "json_object"},
    "functions": [{"name": "f"}], "function_call": {"name": "f"}, "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"], "web_search_options": {"search_context_size": "low"}, "verbosity": "low",
    "moderation": {"model": "omni"}, "repetition_penalty": 1.1, "length_penalty": 0.5, "min_p": 0.1, "min_tokens": 3,
    "ignore_eos": True, "bad_words": ["x"], "allowed_token_ids": [1], "best_of": 2, "use_beam_search": True,
    "prompt_logprobs": 1, "echo": True, "add_generation_prompt": False, "continue_final_message": True,
    "chat_template": "{{ x }}", "documents": [{"text": "d"}], "include_stop_str_in_output": True,
    "guided_json": {"type": "object"}, "guided_regex": "a+", "guided_choice": ["a"], "guided_grammar": "g",
    "structured_outputs": {"json": {}}, "container": "c1", "mcp_servers": [{"type": "url", "url": "http://x"}],
    "context_management": {"edits": []}, "output_format": {"type": "json_schema"},
    "output_config": {"effort": "low"},
}


@pytest.mark.parametrize(("route", "fields"), [("chat", CHAT_FIELDS), ("messages", ANTHROPIC_FIELDS)])
def test_unhonoured_fields_are_refused_by_value(route: str, fields: Fields) -> None:
    for name in sorted(fields.unhonoured):
        with pytest.raises(GatewayError) as exc:
            PARSERS[route]({name: REFUSED_VALUES[name]})
        assert exc.value.param == name and f"'{name}'" in exc.value.message, name


def test_chat_neutral_values_are_accepted() -> None:
    plain = _same(_chat({}))
    for body in ({"verbosity": "medium"}, {"moderation": {}}, {"response_format": {"type": "text"}},
                 {"modalities": ["text"]}, {"min_p": 0}, {"best_of": 1}):
        assert _same(_chat(body)) == plain, body
    assert _same(_messages({"output_config": {"effort": None, "format": None}})) == _same(_messages({}))


# ---------------------------------------------------------------- hostile values

def _deep(n: int) -> Any:
    return json.loads("[" * n + "]" * n)


HOSTILE: list[Any] = [
    _deep(900), 10**400, -(10**30), float("nan"), float("inf"), "x" * 200_000, {str(i): i for i in range(5000)},
    [None] * 5000, True, "", {}, [], -1, 0, 1.5, "\ud800",
]


def _fields_of(route: str) -> list[str]:
    if route == "chat":
        return sorted(_classes(CHAT_FIELDS) - {"messages"})
    if route in ("messages", "count_tokens"):
        return sorted(_classes(ANTHROPIC_FIELDS) - {"messages", "max_tokens"})
    return sorted((set(_USED) | set(_NO_EFFECT) | RESPONSES_REFUSED) - {"input"})


@pytest.mark.parametrize("route", sorted(PARSERS))
def test_hostile_values_of_every_field_are_a_400_or_accepted_never_a_crash(route: str) -> None:
    """Deep nesting, huge numbers, NaN, big strings and objects, lone surrogates in each known
    field: the parser either accepts the value or raises a 400 naming a field (a
    ``GatewayError``), which the route answers; anything else would be a 500."""
    refused, wrong = 0, []
    for name in _fields_of(route):
        for i, value in enumerate(HOSTILE):
            try:
                PARSERS[route]({name: value})
            except GatewayError as err:
                refused += 1
                if err.status != 400 or not err.param or len(err.message) > 1000:
                    wrong.append((name, i, err.status, err.param, err.message[:100]))
            except Exception as exc:  # noqa: BLE001 - what the route would answer with a 500
                wrong.append((name, i, type(exc).__name__, str(exc)[:100]))
    assert not wrong
    assert refused > len(_fields_of(route)) * 4  # most hostile values are refused


# ---------------------------------------------------------------- Anthropic thinking shapes

SWITCH = ReasoningSwitches(switch="enable_thinking")


def test_anthropic_thinking_adaptive_and_display() -> None:
    req, _ = parse_messages_request({"messages": USER, "max_tokens": 64, "thinking": {"type": "adaptive"}}, SWITCH)
    assert req.template_kwargs is None  # the model decides: the template's default
    req, _ = parse_messages_request(
        {"messages": USER, "max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 1024,
                                                             "display": "summarized"}}, SWITCH)
    assert req.template_kwargs == {"enable_thinking": True}
    for thinking in ({"type": "adaptive", "display": "omitted"}, {"type": "between_tools"}, {"type": "adaptive", "x": 1}):
        with pytest.raises(GatewayError) as exc:
            parse_messages_request({"messages": USER, "max_tokens": 64, "thinking": thinking}, SWITCH)
        assert exc.value.param == "thinking", thinking


# ---------------------------------------------------------------- over HTTP: the escape hatch

def test_ignore_request_fields_drops_named_fields_on_every_route(make_harness: Any) -> None:
    h: Harness = make_harness(config=GatewayConfig(ignore_request_fields=["x_trace", "logit_bias"]))
    h.sampler.default = h.reply("ok")
    sid = h.session()
    client = h.openai(sid)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=USER, extra_body={"x_other": 1})  # type: ignore[arg-type]
    assert exc.value.response.json()["error"]["param"] == "x_other"
    out = client.chat.completions.create(
        model="tiny", messages=USER, logit_bias={"5": 100}, extra_body={"x_trace": {"id": 1}}  # type: ignore[arg-type]
    )
    assert out.choices[0].message.content == "ok"
    msg = h.anthropic(sid).messages.create(model="tiny", max_tokens=64, messages=USER, extra_body={"x_trace": 1})  # type: ignore[arg-type]
    assert msg.content[0].text == "ok"  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError):
        h.anthropic(sid).messages.create(model="tiny", max_tokens=64, messages=USER, extra_body={"x_other": 1})  # type: ignore[arg-type]
    resp = client.responses.create(model="tiny", input="hi", extra_body={"x_trace": 1})
    assert resp.output_text == "ok"
    assert len(h.sampler.calls) == 3


def test_ignore_request_fields_is_checked() -> None:
    with pytest.raises(ConfigError, match="messages"):
        GatewayConfig(ignore_request_fields=["messages"])
    with pytest.raises(ConfigError, match="list of field names"):
        GatewayConfig(ignore_request_fields="logit_bias")  # type: ignore[arg-type]


# ---------------------------------------------------------------- strict function tools

STRICT_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                 "additionalProperties": False}
FITS = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
BREAKS = '<tool_call>\n{"name": "f", "arguments": {"a": "one", "b": 2}}\n</tool_call>'


def test_strict_tools_return_only_calls_that_fit_the_schema(harness: Harness) -> None:
    """``strict: true`` is kept by what is returned: a call whose arguments break the schema comes
    back as the model's text, flagged and counted; a fitting call comes back as a call. The
    trained tokens are the generated ones either way."""
    from core.gateway.app import TOOL_CHOICE_HEADER

    h = harness
    h.push(BREAKS, FITS, BREAKS + "\n" + FITS, BREAKS, BREAKS)
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    chat_tool: Any = {"type": "function", "function": {"name": "f", "parameters": STRICT_SCHEMA, "strict": True}}
    bad = client.chat.completions.with_raw_response.create(model="tiny", messages=USER, tools=[chat_tool])
    choice = bad.parse().choices[0]
    assert choice.message.tool_calls is None and choice.message.content == BREAKS and choice.finish_reason == "stop"
    assert bad.headers[TOOL_CHOICE_HEADER] == "violated"
    good = client.chat.completions.with_raw_response.create(model="tiny", messages=USER, tools=[chat_tool])
    (call,) = good.parse().choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"a": 1} and TOOL_CHOICE_HEADER not in good.headers
    mixed = client.chat.completions.create(model="tiny", messages=USER, tools=[chat_tool])
    assert [json.loads(c.function.arguments) for c in mixed.choices[0].message.tool_calls or []] == [{"a": 1}]
    # Not strict: the same call is returned as the model wrote it.
    loose = {"type": "function", "function": {"name": "f", "parameters": STRICT_SCHEMA}}
    out = client.chat.completions.create(model="tiny", messages=USER, tools=[loose])  # type: ignore[list-item]
    assert json.loads((out.choices[0].message.tool_calls or [])[0].function.arguments) == {"a": "one", "b": 2}
    # Responses (flat tools) and Anthropic (input_schema) carry strict the same way.
    flat: Any = {"type": "function", "name": "f", "parameters": STRICT_SCHEMA, "strict": True}
    resp = client.responses.create(model="tiny", input="hi", tools=[flat])
    assert [item.type for item in resp.output] == ["message"] and resp.output_text == BREAKS
    h.push(BREAKS)
    msg = h.anthropic(sid).messages.create(
        model="tiny", max_tokens=256, messages=USER,  # type: ignore[arg-type]
        tools=[{"name": "f", "input_schema": STRICT_SCHEMA, "strict": True}],  # type: ignore[list-item,typeddict-unknown-key]
    )
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "end_turn"
    meta = h.call(h.gw.finish_session, sid)[-1].metadata
    assert meta["strict_violations"] == 4 and meta["tool_calls_dropped"] == 4


def test_strict_schemas_that_cannot_check_anything_fit_nothing() -> None:
    from core.gateway.strict import split_strict, strict_schemas

    schemas = strict_schemas([{"type": "function", "function": {"name": "f", "strict": True,
                                                                "parameters": {"type": 12}}}])
    assert split_strict(schemas, [("f", {"a": 1}), ("g", {"x": 1})]) == ([("g", {"x": 1})], 1)
    assert split_strict(strict_schemas([{"name": "s", "strict": True}], flat=True), [("s", "raw text")]) == ([], 1)
    assert strict_schemas([{"type": "function", "function": {"name": "f"}}]) is None


def test_a_strict_schema_s_remote_ref_is_never_fetched() -> None:
    """A ``$ref`` to a URL is unresolvable (no fit), never a GET: validation runs on the
    gateway's event loop and a client must not make the gateway fetch anything. A local
    HTTP server that would serve the schema counts the requests it gets."""
    from core.gateway.strict import split_strict, strict_schemas

    hits: list[str] = []

    class Serve(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "object"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test counts requests in ``hits``, not in stderr."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Serve)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/s.json"
        remote = strict_schemas([{"name": "r", "strict": True, "input_schema": {"$ref": url}}], flat=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert split_strict(remote, [("r", {})]) == ([], 1)  # unresolvable, so no fit
    finally:
        server.shutdown()
        server.server_close()
    assert hits == [] and [str(w.message) for w in caught] == []


def test_fields_other_servers_take_get_a_hint() -> None:
    for name, sent in (("enable_thinking", "chat_template_kwargs"), ("reasoning", "reasoning_effort"),
                       ("max_output_tokens", "max_completion_tokens")):
        with pytest.raises(GatewayError) as exc:
            _chat({name: False if name == "enable_thinking" else {"effort": "low"}})
        assert exc.value.param == name and sent in exc.value.message, exc.value.message

"""Tool-call parsers per model family, detection from templates, and ill-formed calls end to end."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ConfigError
from core.gateway import Gateway, GatewayConfig
from core.gateway.toolparse import (
    detect_parser,
    get_parser,
    parse_deepseek_v31,
    parse_hermes,
    parse_kimi_k2,
    parse_llama3_json,
    parse_minimax_m2,
    parse_qwen3_coder,
)
from core.samplers import ScriptedSampler
from tests.gateway.conftest import CALC_TOOL, Harness


def test_hermes_single_and_multiple_calls() -> None:
    out = parse_hermes('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
                       '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>')
    assert out.content == "Let me check." and not out.ill_formed
    assert out.tool_calls == [("a", {"x": 1}), ("b", {"y": 2})]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "a", "arguments": {}}',
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call> trailing words',
        'stray </tool_call>',
    ],
)
def test_hermes_ill_formed_returns_raw_text(text: str) -> None:
    out = parse_hermes(text)
    assert out.ill_formed and out.content == text and out.tool_calls == [] and out.error


def test_qwen3_coder_xml() -> None:
    text = ("I will search.\n<tool_call>\n<function=search>\n<parameter=query>\nred fox\n</parameter>\n"
            "<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>")
    out = parse_qwen3_coder(text)
    assert out.content == "I will search." and out.tool_calls == [("search", {"query": "red fox", "limit": 5})]
    bad = parse_qwen3_coder("<tool_call>\n<function=search>\nno params\n</function>\n</tool_call>")
    assert bad.ill_formed
    assert parse_qwen3_coder("<function=x></function>").ill_formed
    assert parse_qwen3_coder("plain").tool_calls == []


def test_llama3_json() -> None:
    assert parse_llama3_json('{"name": "get", "parameters": {"city": "Paris"}}').tool_calls == [
        ("get", {"city": "Paris"})
    ]
    two = parse_llama3_json('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": 1}}')
    assert two.tool_calls == [("a", {}), ("b", {"k": 1})]
    assert parse_llama3_json("Paris is nice.").tool_calls == []
    assert parse_llama3_json('{"name": "a", "parameters": ').ill_formed


def test_detection_and_config_errors() -> None:
    assert detect_parser("... <tool_call> ...") == "hermes"
    assert detect_parser("<tool_call><function=f><parameter=p>") == "qwen3_coder"
    assert detect_parser("{{ '<|python_tag|>' }} ipython") == "llama3_json"
    assert get_parser("none", "x") == (None, None)
    with pytest.raises(ConfigError, match="unknown gateway.tool_parser 'nope'"):
        get_parser("nope", "")
    with pytest.raises(ConfigError, match="no known tool-call format"):
        get_parser("auto", "{% for tool in tools %}{{ tool.name }}{% endfor %}")


def test_template_with_unknown_tool_format_is_a_startup_error(byte_tokenizer: Any) -> None:
    import copy

    tok = copy.copy(byte_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools }}{% endif %}"
    with pytest.raises(ConfigError, match="tool_parser"):
        Gateway(tokenizer=tok, sampler=ScriptedSampler(), config=GatewayConfig())


def test_ill_formed_call_comes_back_as_text_and_is_counted(harness: Harness) -> None:
    h = harness
    broken = '<tool_call>\n{"name": "calculator", "arguments": {"expression": }\n</tool_call>'
    h.push(broken)
    sid = h.session()
    out = h.openai(sid).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], tools=[CALC_TOOL]
    )
    assert out.choices[0].message.content == broken and not out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "stop"
    (row,) = h.call(h.gw.finish_session, sid)
    assert row.metadata["ill_formed_tool_calls"] == 1 and row.metadata["ill_formed_turns"] == 1


def test_call_to_tool_not_offered_is_counted(harness: Harness) -> None:
    h = harness
    h.push('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>')
    sid = h.session()
    out = h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                tools=[CALC_TOOL])
    assert out.choices[0].message.tool_calls[0].function.name == "rm_rf"  # type: ignore[index]
    assert h.gw.session(sid).counters["unknown_tool_calls"] == 1


def test_glm45_calls() -> None:
    from core.gateway.toolparse import parse_glm45

    text = ("Let me look.\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>red fox</arg_value>\n"
            "<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n</tool_call>\n<tool_call>clock</tool_call>")
    out = parse_glm45(text)
    assert out.content == "Let me look." and not out.ill_formed
    assert out.tool_calls == [("search", {"query": "red fox", "limit": 5}), ("clock", {})]
    # As GLM-4.5's template writes them (no newlines), a JSON object value included.
    flat = '<tool_call>f<arg_key>o</arg_key><arg_value>{"a": [1]}</arg_value></tool_call>'
    assert parse_glm45(flat).tool_calls == [("f", {"o": {"a": [1]}})]
    assert parse_glm45("plain").tool_calls == [] and not parse_glm45("plain").ill_formed
    for broken in ("<tool_call>f<arg_key>o</arg_key></tool_call>", "<tool_call><arg_key>o</arg_key><arg_value>1</arg_value></tool_call>",
                   "<tool_call>f<arg_key>o</arg_key><arg_value>1</arg_value>", "stray <arg_key>x</arg_key>"):
        out = parse_glm45(broken)
        assert out.ill_formed and out.content == broken and out.error


def test_mistral_calls_in_both_formats() -> None:
    from core.gateway.toolparse import parse_mistral

    v3 = 'Sure.[TOOL_CALLS] [{"name": "get", "arguments": {"city": "Paris"}, "id": "abcDEF123"}, {"name": "b", "arguments": {}}]'
    out = parse_mistral(v3)
    assert out.content == "Sure." and out.tool_calls == [("get", {"city": "Paris"}), ("b", {})]
    v11 = '[TOOL_CALLS]get[ARGS]{"city": "Paris"}[TOOL_CALLS]b[ARGS]{}'
    assert parse_mistral(v11).tool_calls == [("get", {"city": "Paris"}), ("b", {})]
    assert out.call_ids == ["abcDEF123", None]  # the model's id, where it wrote one
    assert parse_mistral(v11).call_ids == []
    assert parse_mistral('[TOOL_CALLS][{"name": "b", "arguments": {}, "id": "call_1"}]').call_ids == []  # not 9 alnum
    assert parse_mistral("plain").tool_calls == []
    for broken in ("[TOOL_CALLS] [{\"name\": \"get\"", "[TOOL_CALLS]get[ARGS]{oops}", "[TOOL_CALLS] {\"name\": \"x\"}",
                   '[TOOL_CALLS] [{"arguments": {}}]', '[TOOL_CALLS]get[ARGS]{} trailing'):
        out = parse_mistral(broken)
        assert out.ill_formed and out.content == broken and out.error


def test_call_ids_are_the_models_where_kept_and_fresh_ones_fit_the_format() -> None:
    import re

    from core.gateway.toolparse import kept_call_ids, new_call_id, parse_mistral

    out = parse_mistral('[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "aaaaaaaa1"}, '
                        '{"name": "b", "arguments": {}, "id": "bbbbbbbb2"}, {"name": "a", "arguments": {}, "id": "aaaaaaaa3"}]')
    assert kept_call_ids(out, out.tool_calls) == ["aaaaaaaa1", "bbbbbbbb2", "aaaaaaaa3"]
    assert kept_call_ids(out, [("b", {})]) == ["bbbbbbbb2"]  # tool_choice kept only b
    assert kept_call_ids(out, [("a", {}), ("a", {})]) == ["aaaaaaaa1", "aaaaaaaa3"]
    assert kept_call_ids(parse_hermes('<tool_call>{"name": "a", "arguments": {}}</tool_call>'), [("a", {})]) == [None]
    # An id the model wrote twice is kept once: clients match tool results to calls by id.
    twice = parse_mistral('[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "aaaaaaaa1"}, '
                          '{"name": "b", "arguments": {}, "id": "aaaaaaaa1"}, {"name": "c", "arguments": {}, "id": "aaaaaaaa1"}]')
    assert kept_call_ids(twice, twice.tool_calls) == ["aaaaaaaa1", None, None]
    assert kept_call_ids(twice, [("b", {}), ("c", {})]) == ["aaaaaaaa1", None]  # unique among those returned
    assert re.fullmatch(r"[a-zA-Z0-9]{9}", new_call_id("mistral"))  # mistral-common refuses other ids
    assert re.fullmatch(r"call_[0-9a-f]{24}", new_call_id("hermes")) and new_call_id(None).startswith("call_")


def test_detection_of_the_other_families() -> None:
    glm = "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value></tool_call>"
    assert detect_parser(glm) == "glm45"  # before hermes: GLM's template also writes <tool_call>
    assert detect_parser('{{- "[TOOL_CALLS][" }}') == "mistral"
    assert detect_parser("<｜tool▁calls▁begin｜>") == "deepseek_v3"
    assert detect_parser("<|start|>assistant to=functions.f<|channel|>commentary<|call|>") == "harmony"


DS_CALL = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{ARGS}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"


@pytest.mark.parametrize(
    ("parser", "text", "bad_json"),
    [
        ("hermes", '<tool_call>{"name": "f", "arguments": {x}}</tool_call>', True),
        ("hermes", '<tool_call>{"name": "f", "arguments": "{x"}</tool_call>', True),
        ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', True),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', False),
        ("hermes", '<tool_call>{"name": "f", "arguments": {}}', False),
        ("qwen3_coder", "<tool_call>\n<parameter=x>1</parameter>\n</tool_call>", False),
        ("llama3_json", '{"name": "f", "parameters": {x}}', True),
        ("llama3_json", '{"name": "f", "parameters": 3}', True),
        ("llama3_json", '{"parameters": {}}', False),
        ("deepseek_v3", DS_CALL.replace("{ARGS}", "{x}"), True),
        ("deepseek_v3", DS_CALL.replace("{ARGS}", "[1]"), True),
        ("deepseek_v3", "<｜tool▁calls▁begin｜>junk", False),
        ("glm45", "<tool_call>f<arg_key>x</arg_key>stray</tool_call>", False),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {x}}]', True),
        ("mistral", '[TOOL_CALLS]f[ARGS]{x}', True),
        ("mistral", '[TOOL_CALLS][{"arguments": {}}]', False),
        ("harmony", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{x}", True),
        ("harmony", "<|channel|>commentary to=browser.open <|constrain|>json<|message|>{}", False),
    ],
)
def test_a_failed_parse_says_whether_the_json_was_bad_or_the_markup(parser: str, text: str, bad_json: bool) -> None:
    """``bad_json`` decides ``ParseStatus.BAD_JSON`` against ``MARKUP_NO_CALL`` for every parser."""
    from core.gateway.toolparse import PARSERS

    out = PARSERS[parser](text)
    assert out.ill_formed and out.error, out
    assert out.bad_json is bad_json, out.error


_B, _E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


def test_deepseek_v31_calls_parse_and_broken_ones_are_text() -> None:
    """DeepSeek V3.1 / V3.2: JSON arguments right after ``<｜tool▁sep｜>``, calls chained with no
    separator; detected from a template that writes no fenced block (V3's does)."""
    one = "<｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expression\": \"12*7\"}<｜tool▁call▁end｜>"
    two = "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
    out = parse_deepseek_v31(f"Let me check.{_B}{one}{two}{_E}")
    assert out.content == "Let me check." and not out.ill_formed
    assert out.tool_calls == [("calculator", {"expression": "12*7"}), ("get_weather", {"city": "Paris"})]
    assert parse_deepseek_v31("plain answer").tool_calls == []
    not_json = one.replace('12*7"}', "12*7")
    for broken, why in [(f"{_B}{one}", "unterminated"), (f"{_B}{one[:-5]}{_E}", "is not"),
                        (f"{_B}{not_json}{_E}", "not JSON"), (one, "outside")]:
        bad = parse_deepseek_v31(broken)
        assert bad.ill_formed and why in bad.error and bad.content == broken, (broken, bad.error)
    assert parse_deepseek_v31(f"{_B}{one.replace('{', '[1, {').replace('}<', '}]<')}{_E}").bad_json
    assert detect_parser(f"{_B}<｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments") == "deepseek_v31"
    assert detect_parser(f"{_B}<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n") == "deepseek_v3"


def test_kimi_k2_calls_parse_with_the_models_ids_and_broken_ones_are_text() -> None:
    """Kimi K2 / K2.5: the name is read from the model's own call id ``functions.NAME:N``, which is
    kept (``call_ids``) so history renders it as written; content before the section is kept as is."""
    section = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.calculator:0<|tool_call_argument_begin|>"
               '{"expression": "12*7"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1'
               '<|tool_call_argument_begin|>{"city": "Paris", "days": 2}<|tool_call_end|><|tool_calls_section_end|>')
    out = parse_kimi_k2("Checking.\n" + section)
    assert out.content == "Checking.\n" and not out.ill_formed
    assert out.tool_calls == [("calculator", {"expression": "12*7"}), ("get_weather", {"city": "Paris", "days": 2})]
    assert out.call_ids == ["functions.calculator:0", "functions.get_weather:1"]
    assert parse_kimi_k2("plain").tool_calls == [] and parse_kimi_k2("plain").call_ids == []
    for broken, why, bad_json in [
        (section[: -len("<|tool_calls_section_end|>")], "unterminated", False),
        (section.replace("functions.calculator:0", "calculator"), "is not 'functions.NAME:N'", False),
        (section.replace('{"expression": "12*7"}', '{"expression": '), "not JSON", True),
        (section.replace('{"expression": "12*7"}', "[1]"), "not an object", True),
        (section + " and more", "after the tool calls", False),
        (section.replace("<|tool_calls_section_begin|>", ""), "outside", False),
    ]:
        bad = parse_kimi_k2(broken)
        assert bad.ill_formed and why in bad.error and bad.content == broken and bad.bad_json == bad_json, bad.error
    assert detect_parser("{{ '<|tool_calls_section_begin|>' }}") == "kimi_k2"


def test_minimax_m2_calls_parse_and_broken_ones_are_text() -> None:
    """MiniMax M2: ``<invoke name=...>`` per call inside ``<minimax:tool_call>``; parameter values
    JSON-decoded when they parse (the template writes non-strings as JSON)."""
    text = ('Checking.\n<minimax:tool_call>\n<invoke name="calculator">\n<parameter name="expression">12*7'
            '</parameter>\n</invoke>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
            '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>')
    out = parse_minimax_m2(text)
    assert out.content == "Checking." and not out.ill_formed
    assert out.tool_calls == [("calculator", {"expression": "12*7"}), ("get_weather", {"city": "Paris", "days": 2})]
    assert parse_minimax_m2("plain").tool_calls == []
    for broken, why in [(text[: -len("</minimax:tool_call>")], "unterminated"),
                        (text.replace("<parameter name=\"city\">", "city: "), "outside"),
                        ('<invoke name="f"></invoke>', "outside")]:
        bad = parse_minimax_m2(broken)
        assert bad.ill_formed and why in bad.error and bad.content == broken, (broken, bad.error)
    assert detect_parser("{%- set toolcall_begin_token = '<minimax:tool_call>' -%}") == "minimax_m2"

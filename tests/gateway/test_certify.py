"""The chat-template certifier (``core.gateway.certify``): what it finds on every fixture family,
on the tiny model's template, and on deliberately broken templates.

Nothing is faked but the model: the certifier's own sampler writes what the template
writes (the only way to script a model), and every trained token is compared with
transformers' ``apply_chat_template``. The broken templates are the tiny model's template
with one change each (an extra newline where history renders an assistant turn; a tool-call
id written into each call that the parser then drops); the certifier must fail them naming
the first differing token.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from core.gateway import GatewayConfig
from core.gateway.certify import Certificate, cached_certificate, certify
from core.gateway.certify.cache import certificate_key
from core.tokenizer import CHATML_TOOLS_TEMPLATE, build_tiny_tokenizer
from tests.gateway.families import FAMILIES, load

ROOT = Path(__file__).resolve().parents[2]

_HEADER = "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
_CALL = "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
_CALL_END = "{{- '}\\n</tool_call>' }}"


def whitespace_template() -> str:
    """The tiny template, rendering a past assistant turn with one more newline after its header
    than the generation prompt has."""
    broken = CHATML_TOOLS_TEMPLATE.replace(_HEADER, _HEADER.replace("\\n'", "\\n\\n'"))
    assert broken != CHATML_TOOLS_TEMPLATE
    return broken


def call_id_template() -> str:
    """The tiny template, writing each call's id into its ``<tool_call>`` JSON, which the
    Hermes parser drops (the gateway returns an id of its own)."""
    broken = CHATML_TOOLS_TEMPLATE.replace(_CALL, "{%- set call_id = tool_call.id %}" + _CALL).replace(
        _CALL_END, "{{- ', \"id\": \"' + call_id + '\"}\\n</tool_call>' }}"
    )
    assert broken.count("call_id") == 2
    return broken


def dropped_calls_template() -> str:
    """The tiny template, writing no tool call in history (as DeepSeek R1's writes none for a
    message whose content is not None): the model still calls tools, Hermes-style."""
    start = CHATML_TOOLS_TEMPLATE.index("{%- if message.tool_calls %}")
    end = CHATML_TOOLS_TEMPLATE.index("{{- '<|im_end|>\\n' }}{%- elif message.role == 'tool' %}")
    broken = CHATML_TOOLS_TEMPLATE[:start] + CHATML_TOOLS_TEMPLATE[end:]
    assert "tool_call.arguments" not in broken and "<tool_call>" in broken  # still tells the model the format
    return broken


def tiny(template: str = CHATML_TOOLS_TEMPLATE, **kw: Any) -> Any:
    tok = build_tiny_tokenizer(**kw)
    tok.chat_template = template
    return tok


def verdicts(cert: Certificate) -> dict[str, str]:
    return {c.name: c.verdict for c in cert.cases}


def test_the_tiny_template_holds_in_every_case() -> None:
    cert = certify(tiny())
    assert cert.verdict == "holds"
    found = verdicts(cert)
    assert found.pop("unicode") == "n/a"  # the tiny vocabulary has no bytes for non-ASCII text
    assert set(found.values()) == {"holds"} and "reasoning_sent_back" not in found  # no reasoning parser
    assert [e["text"] for e in cert.end_of_turn] == ["<|im_end|>"] and cert.closer_stops
    assert all(c.rows == 1 for c in cert.cases if c.verdict == "holds")


def test_unicode_holds_on_a_tokenizer_with_every_byte() -> None:
    cert = certify(tiny(full_byte_alphabet=True))
    assert verdicts(cert)["unicode"] == "holds", cert.table()


def test_an_extra_newline_in_history_fails_naming_the_first_differing_token() -> None:
    cert = certify(tiny(whitespace_template()))
    assert cert.verdict == "fails"
    plain = next(c for c in cert.cases if c.name == "plain")
    assert plain.verdict == "fails" and plain.diff is not None
    # The model wrote its answer after the generation prompt's one newline; the history
    # rendering has another newline there.
    assert (plain.diff.trace_text, plain.diff.reference_text) == ("H", "\n")
    assert plain.diff.before.endswith("<|im_start|>assistant\n\n")
    assert f"token {plain.diff.index} " in plain.detail and "trace 42 'H', template 98 '\\n'" in plain.detail
    assert any("content came back as '\\nHello! How can I help?'" in p for p in plain.problems)
    assert "case 'plain' fails" in cert.summary() and plain.detail in cert.table()


def test_a_dropped_tool_call_id_fails_naming_the_first_differing_token() -> None:
    cert = certify(tiny(call_id_template()))
    found = verdicts(cert)
    assert found["plain"] == found["long_history"] == "holds"  # no call, nothing dropped
    call = next(c for c in cert.cases if c.name == "tool_call")
    assert call.verdict == "fails" and call.diff is not None
    # The model's call00001 is served; the history renders the id the gateway returned (call_<hex>).
    assert call.diff.before.endswith('id": "call') and (call.diff.trace_text, call.diff.reference_text) == ("0", "_")
    assert call.detail.startswith("turn 2: the trained prompt is not apply_chat_template's: token ")
    assert {found["parallel_calls"], found["new_question"]} == {"fails"}


def test_a_template_that_drops_tool_calls_from_history_forks_exactly() -> None:
    """The model's calls come back to the client; the history the client sends back renders
    without them, so the gateway starts a new row with the template's rendering (it does not
    extend the served tokens, which hold the calls): a documented fork, every row exact. Only a
    trained prompt the template does not render would fail."""
    cert = certify(tiny(dropped_calls_template()))
    found = verdicts(cert)
    assert cert.verdict == "forks", cert.table()
    assert found["plain"] == found["tools_unused"] == "holds"
    assert found["tool_call"] == found["parallel_calls"] == found["new_question"] == "forks"
    call = next(c for c in cert.cases if c.name == "tool_call")
    assert call.rows == 2 and not call.problems
    assert call.detail.startswith("the template writes no tool call in history (drops ['calculator'])")
    # The served tokens hold the call ('<' of '<tool_call>'); the history closes the empty turn.
    assert call.forks[0].endswith("served 30 '<', template 2 '<|im_end|>'"), call.forks


EXPECTED = {
    "qwen2.5": ("holds", set()),
    "qwen3-coder": ("holds", set()),
    "llama3.1": ("holds", set()),
    "deepseek-v3": ("holds", set()),
    "qwen3": ("forks", set()),
    "qwen3-nothink": ("forks", set()),
    "gpt-oss": ("forks", set()),
    # R1's template drops past reasoning and writes no tool call in history: the turn after
    # either starts a new row with the template's rendering (exact).
    "deepseek-r1": ("forks", set()),
    # Mistral v3 writes the system prompt (and the tools) in front of the last user message:
    # each new question re-renders the history.
    "mistral-nemo": ("forks", set()),
    # GLM-4.6: one row unless past reasoning is dropped (a new question, a client dropping it).
    # DeepSeek V3.1 (thinking off): one row; with thinking on, history writes the block empty.
    "deepseek-v3.1": ("forks", set()),
    # MiniMax M2's generation prompt opens <think>: a turn without reasoning, or a new question, forks;
    # a tool loop whose reasoning is sent back is one row (XML arguments: the anchor cuts at [e~[).
    "minimax-m2": ("forks", set()),
    # Nemotron 3 Nano: the generation prompt opens <think>; history writes an empty block as
    # <think></think>: a tool loop with reasoning sent back is one row, other cases fork.
    "nemotron-3-nano": ("forks", set()),
    # Gemma 3 renders no tools: the cases offering them are n/a (the gateway refuses them), the rest hold.
    "gemma-3": ("holds", set()),
    "glm-4.6": ("forks", set()),
    # Qwen3.5 / 3.6: the generation prompt opens <think>\n; an empty block tokenizes differently in
    # history ('\n\n' one token), and a new question drops past reasoning; preserve_thinking keeps it.
    "qwen3.5": ("forks", set()),
    "qwen3.6": ("forks", set()),
    "qwen3.6-preserve": ("forks", set()),
    # Kimi K2.5: a tool loop whose reasoning is sent back is one row; its final answer re-renders the
    # loop without reasoning, so a new question forks; a turn with an empty reasoning block forks.
    "kimi-k2.5": ("forks", set()),
    # GLM-4.7's generation prompt opens <think>; a turn without reasoning is '</think>' in history.
    "glm-4.7": ("forks", set()),
}
"""Each fixture family's verdict and failing cases (docs/gateway.md, Model families)."""


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_fixture_family_certifies_as_documented(name: str) -> None:
    assert set(EXPECTED) == set(FAMILIES), "add the new family's verdict to EXPECTED and docs/gateway.md"
    family = FAMILIES[name]
    generation = {"eos_token_id": list(family.generation_eos)} if family.generation_eos else None
    cert = certify(load(name), config=GatewayConfig(chat_template_kwargs=dict(family.kwargs)),
                   generation_config=generation)
    verdict, failing = EXPECTED[name]
    assert (cert.verdict, {c.name for c in cert.failing()}) == (verdict, failing), cert.table()
    for case in cert.cases:
        if case.verdict == "forks":
            assert case.forks and all("starts row" in f for f in case.forks)
        if case.verdict == "fails":
            assert case.problems


def test_certificates_are_cached_by_what_they_certify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import core.gateway.certify.cache as cache

    monkeypatch.setattr(cache, "_MEMORY", {})  # earlier tests in this process certified the tiny template
    tok = tiny()
    first, cached = asyncio.run(cached_certificate(tok, end_of_turn_ids=(2,), directory=tmp_path))
    assert not cached
    files = list(tmp_path.glob("*.json"))
    assert [f.stem for f in files] == [certificate_key(tok, None, (2,))]
    assert Certificate.from_json(files[0].read_text()).to_json() == first.to_json()
    again, cached = asyncio.run(cached_certificate(tok, end_of_turn_ids=(2,), directory=tmp_path))
    assert cached and again.to_json() == first.to_json()
    other = certificate_key(tiny(whitespace_template()), None, (2,))
    assert other != files[0].stem
    assert certificate_key(tok, GatewayConfig(keep_reasoning=True), (2,)) != files[0].stem


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "core.gateway", "certify", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_the_command_prints_the_table_and_writes_the_certificate(tmp_path: Path) -> None:
    ok = _cli("tiny", "--out", str(tmp_path / "ok.json"), cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "verdict: chat template" in ok.stdout and "holds" in ok.stdout
    data = json.loads((tmp_path / "ok.json").read_text())
    assert data["verdict"] == "holds" and len(data["template_sha256"]) == 64
    (tmp_path / "broken.jinja").write_text(whitespace_template())
    bad = _cli("tiny", "--chat-template", str(tmp_path / "broken.jinja"), "--out", str(tmp_path / "bad.json"), cwd=ROOT)
    assert bad.returncode == 1
    assert "trace 42 'H', template 98 '\\n'" in bad.stdout
    assert json.loads((tmp_path / "bad.json").read_text())["verdict"] == "fails"
    fixture = _cli("qwen2.5", "--out", "-", cwd=ROOT)
    assert fixture.returncode == 0 and json.loads(fixture.stdout)["verdict"] == "holds"

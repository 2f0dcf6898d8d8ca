"""Templates with rules about the whole conversation still serve every turn; limits are sane.

The gateway renders a continuation after a made-up two-message anchor
conversation. A template that checks the whole conversation (here: a system
message must come first, as some model templates insist) refuses that anchor
even though it accepts the agent's real history; the gateway must then render
the whole history, not answer 400 from turn 2 on.
"""

from __future__ import annotations

import asyncio

import pytest

from core.errors import ConfigError
from core.gateway import Gateway, GatewayConfig
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.samplers import ScriptedSampler, encode_reply
from core.tokenizer import CHATML_TOOLS_TEMPLATE, build_tiny_tokenizer
from core.types import SamplingParams

SYSTEM_FIRST = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ raise_exception('the first message must be a system message') }}{% endif %}"
    + CHATML_TOOLS_TEMPLATE
)


def test_a_template_that_refuses_the_anchor_still_serves_later_turns() -> None:
    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320, chat_template=SYSTEM_FIRST)
    replies = [encode_reply(tok, "first"), encode_reply(tok, "second")]
    gw = Gateway(tokenizer=tok, sampler=ScriptedSampler(replies, tokenizer=tok), config=GatewayConfig())
    sid = gw.create_session(sampling=SamplingParams(max_tokens=16))
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]

    async def go() -> None:
        first = await gw.run_turn(sid, TurnRequest(units=openai_units(history)))
        history.append({"role": "assistant", "content": first.content})
        history.append({"role": "user", "content": "again"})
        await gw.run_turn(sid, TurnRequest(units=openai_units(history)))

    asyncio.run(go())
    rows = gw.finish_session(sid)
    assert sum(len(r.turns) for r in rows) == 2
    # The served prompt of turn 2 is the template's rendering of the real history.
    expected = tok.apply_chat_template(history, tokenize=True, add_generation_prompt=True)
    expected = list(getattr(expected, "input_ids", expected))
    last = rows[-1]
    assert last.token_ids[: len(expected)] == expected


def test_large_tool_call_arguments_in_the_tail_render_off_the_event_loop() -> None:
    """The size that sends a render to the worker threads counts tool-call arguments, which a
    client can make as large as any message content."""
    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320)
    replies = [encode_reply(tok, "first"), encode_reply(tok, "second")]
    gw = Gateway(
        tokenizer=tok,
        sampler=ScriptedSampler(replies, tokenizer=tok),
        config=GatewayConfig(render_offload_chars=2000),
    )
    sid = gw.create_session(sampling=SamplingParams(max_tokens=16))
    history = [{"role": "user", "content": "hi"}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": "' + "y" * 3000 + '"}'}}

    async def go() -> None:
        first = await gw.run_turn(sid, TurnRequest(units=openai_units(history)))
        history.append({"role": "assistant", "content": first.content})
        history.append({"role": "user", "content": "call it"})
        history.append({"role": "assistant", "content": "", "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
        assert gw.prompts._render_pool is None  # turn 1 rendered inline
        await gw.run_turn(sid, TurnRequest(units=openai_units(history)))

    asyncio.run(go())
    assert gw.prompts._render_pool is not None


@pytest.mark.parametrize("key", ["max_connections", "body_read_timeout_s", "max_turns_per_session"])
def test_negative_limits_are_refused_by_name(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        GatewayConfig(**{key: -1})


def test_stopping_the_server_stops_the_render_threads() -> None:
    from core.gateway import GatewayServer

    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320)
    gw = Gateway(
        tokenizer=tok,
        sampler=ScriptedSampler(default=encode_reply(tok, "ok"), tokenizer=tok),
        config=GatewayConfig(render_offload_chars=0),
    )

    async def go() -> None:
        async with GatewayServer(gw, host="127.0.0.1", port=0):
            sid = gw.create_session(sampling=SamplingParams(max_tokens=4))
            await gw.run_turn(sid, TurnRequest(units=openai_units([{"role": "user", "content": "hi"}])))
            assert gw.prompts._render_pool is not None
            pool = gw.prompts._render_pool
        assert gw.prompts._render_pool is None and pool._shutdown

    asyncio.run(go())


def test_the_samplers_own_end_of_turn_ids_are_stop_ids_of_every_session() -> None:
    """A backend that read its model's generation config (the local sampler) knows end-of-turn
    ids the tokenizer's files may not list; the gateway must know them too."""
    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320)
    extra = tok.convert_tokens_to_ids("<|im_start|>")

    class ModelAwareSampler(ScriptedSampler):
        end_of_turn_ids = (extra,)

    gw = Gateway(tokenizer=tok, sampler=ModelAwareSampler(tokenizer=tok), config=GatewayConfig())
    assert extra in gw.end_of_turn_ids and tok.eos_token_id in gw.end_of_turn_ids
    sid = gw.create_session(sampling=SamplingParams(max_tokens=4))
    assert extra in gw.session(sid).sampling.stop_token_ids


def test_a_session_finished_while_its_prompt_renders_in_a_thread_samples_nothing() -> None:
    import threading

    from core.gateway.errors import GatewayError

    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320)
    sampler = ScriptedSampler(default=encode_reply(tok, "ok"), tokenizer=tok)
    gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(render_offload_chars=0))
    sid = gw.create_session(sampling=SamplingParams(max_tokens=4))
    started, release = threading.Event(), threading.Event()
    real = gw.renderer.render_prompt

    def slow_render(*args: object, **kwargs: object) -> list[int]:
        started.set()
        release.wait(10)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    gw.renderer.render_prompt = slow_render  # type: ignore[method-assign]

    async def go() -> None:
        turn = asyncio.create_task(
            gw.run_turn(sid, TurnRequest(units=openai_units([{"role": "user", "content": "hi"}])))
        )
        while not started.is_set():
            await asyncio.sleep(0.01)
        gw.finish_session(sid)
        release.set()
        with pytest.raises(GatewayError) as info:
            await turn
        assert info.value.status == 409

    asyncio.run(go())
    assert sampler.calls == []

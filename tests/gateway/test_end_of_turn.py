"""End of turn: the gateway stops on every end-of-turn id the model declares, not only EOS.

The tokenizer is built offline (``core.testing.tokenizers``): Llama 3's framing,
EOS ``<|end_of_text|>``, end of turn ``<|eot_id|>``. The scripted sampler plays a
model that ends its turn with ``<|eot_id|>`` and then, if nobody stops it,
invents the user's next message; it honours the stop ids it is sent, as vLLM,
SGLang and the local sampler do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.gateway import Gateway, GatewayConfig
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.samplers import HttpSamplerConfig, ScriptedSampler, build_http_sampler
from core.testing.tokenizers import EOM, EOS, EOT, build_llama3_style_tokenizer
from core.tokenizer import build_tiny_tokenizer, end_of_turn_ids
from core.types import FinishReason, SamplingParams
from tests.samplers.servers import BackgroundLoop, StandIn, UvicornApp

INVENTED = "<|start_header_id|>user<|end_header_id|>\n\nI am an invented user turn"


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def llama_tok() -> Any:
    return build_llama3_style_tokenizer()


def test_end_of_turn_ids_collects_eos_generation_config_and_template(tmp_path: Path, llama_tok: Any) -> None:
    eos, eot, eom = (llama_tok.convert_tokens_to_ids(t) for t in (EOS, EOT, EOM))
    assert eos != eot
    assert end_of_turn_ids(llama_tok) == (eos, eot)  # EOS + the template's end-of-turn token
    # A model directory whose generation_config.json lists several eos ids.
    saved = build_llama3_style_tokenizer(tmp_path, generation_eos=[EOS, EOM, EOT])
    assert end_of_turn_ids(saved) == (eos, eom, eot)
    # An explicit generation config (a model's, or a dict) wins over the files.
    assert end_of_turn_ids(saved, generation_config={"eos_token_id": eom}) == (eos, eom, eot)
    assert end_of_turn_ids(llama_tok, generation_config={"eos_token_id": [eom]}) == (eos, eom, eot)
    # ChatML: <|im_end|> is both EOS and the end of turn.
    chatml = build_tiny_tokenizer()
    assert end_of_turn_ids(chatml) == (chatml.eos_token_id,)


def test_gateway_stops_at_end_of_turn_and_trains_exactly_the_turn(make_harness: Any, llama_tok: Any) -> None:
    tok = llama_tok
    eot, eos = tok.convert_tokens_to_ids(EOT), tok.eos_token_id
    sampler = ScriptedSampler(tokenizer=tok)  # stops on its own EOS and on the ids it is sent
    h = make_harness(tokenizer=tok, sampler=sampler)
    for text in ("Hello there", "Second"):
        sampler.push([*_ids(tok, text), eot, *_ids(tok, INVENTED), eot, eos])
    sid = h.session()
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    out = client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "Hello there" and out.choices[0].finish_reason == "stop"
    messages += [{"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "again"}]
    out = client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "Second"
    assert all(eot in call.params.stop_token_ids for call in sampler.calls)
    (row,) = h.call(h.gw.finish_session, sid)
    row.validate()
    spans = [tok.decode(row.token_ids[s.start : s.end]) for s in row.turns]
    assert spans == ["Hello there" + EOT, "Second" + EOT]  # each trained span ends with <|eot_id|>
    assert all(row.token_ids[s.end - 1] == eot for s in row.turns)
    assert all(s.finish_reason is FinishReason.STOP for s in row.turns)
    assert "invented" not in tok.decode(row.token_ids)
    # Exact trace: the row is the template's rendering of what the agent saw.
    full = tok.apply_chat_template([*messages, {"role": "assistant", "content": "Second"}], tokenize=False)
    assert row.token_ids == _ids(tok, full)


def test_generation_config_eos_list_stops_at_the_first_of_them(make_harness: Any, tmp_path: Path) -> None:
    tok = build_llama3_style_tokenizer(tmp_path, generation_eos=[EOS, EOM, EOT])
    eom, eot = tok.convert_tokens_to_ids(EOM), tok.convert_tokens_to_ids(EOT)
    sampler = ScriptedSampler(tokenizer=tok)
    h = make_harness(tokenizer=tok, sampler=sampler)
    assert set(h.gw.end_of_turn_ids) == {tok.eos_token_id, eom, eot}
    sampler.push([*_ids(tok, "call it"), eom, *_ids(tok, INVENTED), eot, tok.eos_token_id])
    sid = h.session()
    out = h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "call it"
    (row,) = h.call(h.gw.finish_session, sid)
    (span,) = row.turns
    assert tok.decode(row.token_ids[span.start : span.end]) == "call it" + EOM
    assert row.loss_mask[span.start : span.end] == [1] * (span.end - span.start)
    assert sum(row.loss_mask) == span.end - span.start


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_http_samplers_send_every_end_of_turn_id(kind: str, llama_tok: Any) -> None:
    """vLLM and SGLang get the ids as ``stop_token_ids`` (a stand-in engine records the body)."""
    tok = llama_tok
    eot = tok.convert_tokens_to_ids(EOT)
    bg = BackgroundLoop()
    standin = StandIn(tokens=[*_ids(tok, "ok"), eot])
    server = UvicornApp(standin.app())
    bg.run(server.start())
    sampler = build_http_sampler(HttpSamplerConfig(kind=kind, urls=[server.url], health_interval_s=0))
    try:
        gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig())

        async def turn() -> Any:
            sid = gw.create_session(sampling=SamplingParams(max_tokens=8, stop_token_ids=(7,)))
            await gw.run_turn(sid, TurnRequest(units=openai_units([{"role": "user", "content": "hi"}])))
            return gw.finish_session(sid)

        (row,) = bg.run(turn())
        (hit,) = standin.generate_hits()
        assert hit.body["sampling_params"]["stop_token_ids"] == [7, tok.eos_token_id, eot]
        assert row.token_ids[row.turns[0].end - 1] == eot
    finally:
        bg.run(sampler.aclose())
        bg.run(server.stop())
        bg.close()

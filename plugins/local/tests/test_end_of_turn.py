"""The local sampler behind the gateway: end-of-turn ids other than EOS, and per-call seeds.

End of turn: a ``ScriptedLM`` (a causal LM whose logits put all mass on the
next token of a script) plays a model that ends its turn with ``<|eot_id|>``
(or ``<|eom_id|>``) and then invents the next turn. The thing under test is
the sampler's stopping, not the model, so the model is scripted; the tokenizer
is built offline (``core.testing.tokenizers``). Seeds: the real tiny model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from local_helpers import run
from tracerl_local.sampler import LocalSampler

from core.gateway import Gateway, GatewayConfig
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.testing.tokenizers import EOM, EOS, EOT, build_llama3_style_tokenizer
from core.types import FinishReason, SamplingParams

INVENTED = "<|start_header_id|>user<|end_header_id|>\n\ninvented"


class ScriptedLM(torch.nn.Module):
    """Emits ``script`` token by token at any temperature (logit 0 on the scripted
    token, -1e4 elsewhere); follows ``generate_batch``'s forward contract."""

    def __init__(self, vocab: int, script: Sequence[int], eos_token_id: Any = None) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device
        self.vocab = vocab
        self.script = list(script)
        self.generation_config = SimpleNamespace(eos_token_id=eos_token_id)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        use_cache: bool = False,
        logits_to_keep: int = 0,
        past_key_values: Any = None,
    ) -> Any:
        step = 0 if past_key_values is None else past_key_values + 1
        logits = torch.full((input_ids.shape[0], 1, self.vocab), -1e4)
        logits[:, :, self.script[min(step, len(self.script) - 1)]] = 0.0
        return SimpleNamespace(logits=logits, past_key_values=step)


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _sample(sampler: LocalSampler, prompt: list[int], params: SamplingParams) -> Any:
    async def go() -> Any:
        try:
            return await sampler.sample(prompt, params, session_id="s")
        finally:
            await sampler.aclose()

    return run(go())


def test_local_sampler_stops_at_the_template_end_of_turn_not_only_eos() -> None:
    tok = build_llama3_style_tokenizer()
    eot = tok.convert_tokens_to_ids(EOT)
    script = [*_ids(tok, "Hi"), eot, *_ids(tok, INVENTED), tok.eos_token_id]
    sampler = LocalSampler(ScriptedLM(len(tok), script), tok, max_positions=256)
    assert set(sampler.end_of_turn_ids) == {tok.eos_token_id, eot}
    prompt = _ids(tok, tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True))
    result = _sample(sampler, prompt, SamplingParams(max_tokens=64))
    assert tok.decode(result.token_ids) == "Hi" + EOT
    assert result.finish_reason is FinishReason.STOP


def test_local_sampler_stops_at_the_first_generation_config_eos(tmp_path: Path) -> None:
    tok = build_llama3_style_tokenizer(tmp_path, generation_eos=[EOS, EOM, EOT])
    eom, eot = tok.convert_tokens_to_ids(EOM), tok.convert_tokens_to_ids(EOT)
    script = [*_ids(tok, "call"), eom, *_ids(tok, INVENTED), eot, tok.eos_token_id]
    model = ScriptedLM(len(tok), script, eos_token_id=[tok.eos_token_id, eom, eot])
    sampler = LocalSampler(model, tok, max_positions=256)
    result = _sample(sampler, _ids(tok, "<|start_header_id|>assistant<|end_header_id|>\n\n"), SamplingParams(max_tokens=64))
    assert tok.decode(result.token_ids) == "call" + EOM


def test_gateway_over_the_local_sampler_trains_the_turn_up_to_its_end_of_turn_token() -> None:
    tok = build_llama3_style_tokenizer()
    eot = tok.convert_tokens_to_ids(EOT)
    script = [*_ids(tok, "Hello"), eot, *_ids(tok, INVENTED), tok.eos_token_id]
    sampler = LocalSampler(ScriptedLM(len(tok), script), tok, max_positions=256)
    gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig())
    messages = [{"role": "user", "content": "hi"}]

    async def go() -> Any:
        try:
            sid = gw.create_session(sampling=SamplingParams(max_tokens=64))
            out = await gw.run_turn(sid, TurnRequest(units=openai_units(messages)))
            return out, gw.finish_session(sid)
        finally:
            await sampler.aclose()

    out, (row,) = run(go())
    assert out.content == "Hello" and out.finish_reason is FinishReason.STOP
    (span,) = row.turns
    assert tok.decode(row.token_ids[span.start : span.end]) == "Hello" + EOT
    assert sum(row.loss_mask) == span.end - span.start
    full = tok.apply_chat_template([*messages, {"role": "assistant", "content": "Hello"}], tokenize=False)
    assert row.token_ids == _ids(tok, full)


@pytest.mark.parametrize("history_mode", ["linear", "tree"])
def test_concurrent_turns_of_a_seeded_session_sample_differently_and_reproducibly(
    make_backend: Any, history_mode: str
) -> None:
    """Four identical requests at once (best-of-N) in one seeded session: four samples."""
    backend = make_backend(seed=0)
    gw = Gateway(tokenizer=backend.get_tokenizer(), sampler=backend.sampler, config=GatewayConfig(history_mode=history_mode))
    messages = [{"role": "system", "content": "Say the next digit."}, {"role": "user", "content": "After 3?"}]

    async def session() -> list[tuple[int, ...]]:
        sid = gw.create_session(sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=11))
        req = TurnRequest(units=openai_units(messages))
        await asyncio.gather(*(gw.run_turn(sid, req) for _ in range(4)))
        rows = gw.finish_session(sid)
        return [tuple(t for t, m in zip(r.token_ids, r.loss_mask, strict=True) if m) for r in rows]

    first = run(session())
    assert len(first) == 4 and len(set(first)) == 4
    assert run(session()) == first

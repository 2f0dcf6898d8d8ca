"""Randomized trace properties: whatever agents do, rows hold what the model was fed and generated.

Hypothesis draws a seed; from it, several agents drive their own gateway
sessions at once through the service API (``Gateway.run_turn``, what the HTTP
routes call), in linear and tree mode: extending the conversation, rewriting
an earlier message, cutting the history back and regenerating, sub-agents with
another system prompt, concurrent branches (best-of-N), cancelled turns
(client gone), replies cut by ``max_tokens`` or by the context budget, and a
sampler that sometimes fails or aborts. The sampler is scripted (the model is
the one thing a test cannot script) and records every prompt it was sent and
every reply it handed back.

Properties, per session:

- every trained span's prefix (the row's tokens before the span) is a prompt
  the sampler was actually sent, and the span is exactly the reply it gave;
- every reply that reached the gateway un-aborted is trained exactly once
  across the session's rows (mask 1 in one row, context elsewhere), with the
  sampler's logprobs on its tokens; nothing else is trained; aborted, failed
  and cancelled calls are never trained.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.gateway import Gateway, GatewayConfig, GatewayError
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.samplers.scripted import fake_logprob
from core.types import FinishReason, SampleResult, SamplingParams

WORDS = ("alpha", "beta", "gamma", "delta", "x", "yy", "zed", "ok")

Pair = tuple[tuple[int, ...], tuple[int, ...]]


class RecordingSampler:
    """Random replies from a seeded RNG; records prompts sent and replies returned per session."""

    def __init__(self, tok: Any, rnd: random.Random) -> None:
        self.tok = tok
        self.rnd = rnd
        self.sent: dict[str, set[tuple[int, ...]]] = {}
        self.returned: dict[str, Counter[Pair]] = {}
        self.aborted: dict[str, list[Pair]] = {}

    async def sample(self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str) -> SampleResult:
        prompt = tuple(prompt_token_ids)
        self.sent.setdefault(session_id, set()).add(prompt)
        for _ in range(self.rnd.randint(0, 3)):  # let other turns interleave (or a cancel land)
            await asyncio.sleep(0)
        roll = self.rnd.random()
        if roll < 0.04:
            raise RuntimeError("scripted backend failure")
        text = " ".join(self.rnd.choice(WORDS) for _ in range(self.rnd.randint(1, 4)))
        ids = list(self.tok.encode(text, add_special_tokens=False))
        if self.rnd.random() < 0.85:
            ids.append(self.tok.eos_token_id)
        finish = FinishReason.STOP if ids[-1] in params.stop_token_ids else FinishReason.LENGTH
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], FinishReason.LENGTH
        if roll < 0.10:
            cut = ids[: self.rnd.randint(0, len(ids))]
            self.aborted.setdefault(session_id, []).append((prompt, tuple(cut)))
            return SampleResult(cut, [fake_logprob(t, i) for i, t in enumerate(cut)], FinishReason.ABORT, 0)
        self.returned.setdefault(session_id, Counter())[(prompt, tuple(ids))] += 1
        return SampleResult(ids, [fake_logprob(t, i) for i, t in enumerate(ids)], finish, 0)


class Agent:
    """One agent run: a set of conversations it knows (as it saw them) and random moves."""

    def __init__(self, gw: Gateway, sid: str, rnd: random.Random, name: str) -> None:
        self.gw, self.sid, self.rnd = gw, sid, rnd
        self.convs: list[list[dict[str, Any]]] = [
            [{"role": "system", "content": f"agent {name}"}, {"role": "user", "content": "task"}]
        ]
        self.n = 0

    def _user(self) -> dict[str, Any]:
        self.n += 1
        return {"role": "user", "content": f"u{self.n} " + self.rnd.choice(WORDS)}

    def _next_request(self) -> list[dict[str, Any]]:
        rnd = self.rnd
        conv = [dict(m) for m in (self.convs[-1] if rnd.random() < 0.6 else rnd.choice(self.convs))]
        move = rnd.choices(("extend", "edit", "truncate", "subagent"), weights=(14, 2, 2, 1))[0]
        if move == "edit":
            users = [i for i, m in enumerate(conv) if m["role"] == "user"]
            i = rnd.choice(users)
            conv[i] = {"role": "user", "content": conv[i]["content"] + " (edited)"}
        elif move == "truncate" and len(conv) > 2:
            conv = conv[: rnd.randint(2, len(conv) - 1)]
        elif move == "subagent":
            conv = [{"role": "system", "content": f"sub {self.n}"}]
        if conv[-1]["role"] != "user":
            conv.append(self._user())
        return conv

    async def _turn(self, messages: list[dict[str, Any]]) -> None:
        req = TurnRequest(units=openai_units(messages), max_tokens=self.rnd.choice((None, None, None, 4)))
        try:
            out = await self.gw.run_turn(self.sid, req)
        except GatewayError:  # 503 sampler failure or abort, 400 context overflow: the agent moves on
            self.convs.append(messages)
            return
        self.convs.append([*messages, {"role": "assistant", "content": out.content}])

    async def run(self, steps: int) -> None:
        for _ in range(steps):
            kind = self.rnd.random()
            if kind < 0.2:  # concurrent branches: best-of-N or parallel sub-calls
                same = self.rnd.random() < 0.5
                first = self._next_request()
                reqs = [first if same else self._next_request() for _ in range(self.rnd.randint(2, 3))]
                await asyncio.gather(*(self._turn(m) for m in reqs))
            elif kind < 0.3:  # the client goes away mid-turn
                task = asyncio.ensure_future(self._turn(self._next_request()))
                for _ in range(self.rnd.randint(0, 2)):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            else:
                await self._turn(self._next_request())


def _check_session(gw: Gateway, sampler: RecordingSampler, sid: str) -> int:
    rows = gw.finish_session(sid)
    sent = sampler.sent.get(sid, set())
    returned = sampler.returned.get(sid, Counter())
    trained: Counter[Pair] = Counter()
    for row in rows:
        row.validate()
        in_span = [False] * len(row.token_ids)
        for span in row.turns:
            prefix = tuple(row.token_ids[: span.start])
            gen = tuple(row.token_ids[span.start : span.end])
            assert prefix in sent, "a trained span follows a prompt the sampler was never sent"
            assert (prefix, gen) in returned, "a span holds tokens the sampler never returned for that prompt"
            mask = row.loss_mask[span.start : span.end]
            assert len(set(mask)) <= 1, "a turn is partly trained"
            if mask and mask[0] == 1:
                trained[(prefix, gen)] += 1
                assert row.logprobs[span.start : span.end] == [fake_logprob(t, i) for i, t in enumerate(gen)]
            for i in range(span.start, span.end):
                in_span[i] = True
        assert all(in_span[i] for i, m in enumerate(row.loss_mask) if m), "a token outside every turn is trained"
    nonempty = Counter({k: v for k, v in returned.items() if k[1]})
    assert trained == nonempty, "a generated turn is not trained exactly once"
    for prefix, cut in sampler.aborted.get(sid, []):
        if cut and not returned.get((prefix, cut)):
            assert (prefix, cut) not in trained
    counters = rows[0].metadata if rows else gw.session(sid).counters
    assert counters["aborted_turns"] == len(sampler.aborted.get(sid, []))
    return sum(trained.values())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_rows_hold_exactly_what_was_sent_and_returned(byte_tokenizer: Any, seed: int) -> None:
    rnd = random.Random(seed)
    sampler = RecordingSampler(byte_tokenizer, rnd)
    gw = Gateway(tokenizer=byte_tokenizer, sampler=sampler, config=GatewayConfig())

    async def go() -> list[str]:
        agents = []
        for i in range(4):
            sid = gw.create_session(
                sampling=SamplingParams(max_tokens=rnd.choice((6, 32, 32))),
                max_context_tokens=rnd.choice((0, 0, 120, 200)),
                history_mode=rnd.choice(("linear", "tree")),
            )
            agents.append(Agent(gw, sid, rnd, str(i)))
        await asyncio.gather(*(a.run(rnd.randint(4, 12)) for a in agents))
        return [a.sid for a in agents]

    for sid in asyncio.run(go()):
        _check_session(gw, sampler, sid)

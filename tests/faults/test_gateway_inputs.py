"""Bad client input against the gateway in the middle of a training step.

One training run (real gateway, real agent process, ``Trainer`` with the fake
backend): while the first model call of step 2 is inside the gateway, hostile
requests go to the same gateway, most of them with that very rollout's session
key. Each must get a 4xx; the rollout whose call was held, and every other
rollout of the step, must finish ``ok`` and train as usual.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.testing.fakes import FakeBackend
from core.types import SamplingParams
from tests.faults.harness import (
    LoopSpy,
    assert_metrics_match,
    assert_trained_only_ok,
    fault_config,
    hook_sampler,
    run_loop,
    statuses,
    step_records,
)

pytestmark = pytest.mark.integration


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _chat(content: str = "hi") -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": content}]}


# name -> (path, session key: "live" | "unknown" | "closed", raw body)
CASES: dict[str, tuple[str, str, bytes]] = {
    "deeply_nested_json": (
        "/v1/chat/completions",
        "live",
        (
            '{"model": "fake", "messages": [{"role": "user", "content": "go"}], "tools": [{"type": '
            '"function", "function": {"name": "f", "parameters": {"x": ' + _nested(5000) + "}}}]}"
        ).encode(),
    ),
    "lone_surrogate": (
        "/v1/chat/completions",
        "live",
        b'{"model": "fake", "messages": [{"role": "user", "content": "a \\ud800 b"}]}',
    ),
    # 540 kB, 100x the session's 4096-token budget (5 MB: see the xfail test below)
    "huge_count_tokens_body": (
        "/v1/messages/count_tokens",
        "live",
        json.dumps({"messages": [{"role": "user", "content": "After 3? " * 60_000}]}).encode(),
    ),
    "unknown_session": ("/v1/chat/completions", "unknown", json.dumps(_chat()).encode()),
    "closed_session": ("/v1/chat/completions", "closed", json.dumps(_chat()).encode()),
}

EXPECTED = {
    "deeply_nested_json": 400,
    "lone_surrogate": 400,
    "huge_count_tokens_body": 400,  # over the session's token budget
    "unknown_session": 401,
    "closed_session": 409,
}


@dataclass
class HostileRun:
    code: int
    backend: FakeBackend
    spy: LoopSpy
    run_dir: Path
    live_session: str = ""
    answers: dict[str, tuple[int, str]] = field(default_factory=dict)


async def _send_all(spy: LoopSpy, live: str) -> dict[str, tuple[int, str]]:
    assert spy.trainer is not None
    gateway, server = spy.trainer.gateway, spy.trainer.server
    closed = gateway.create_session(sampling=SamplingParams(max_tokens=4))
    gateway.finish_session(closed)
    keys = {"live": live, "unknown": f"sess-{uuid.uuid4().hex}", "closed": closed}
    answers: dict[str, tuple[int, str]] = {}
    try:
        async with httpx.AsyncClient(base_url=server.root_url, timeout=60) as client:
            for name, (path, key, body) in CASES.items():
                try:
                    r = await client.post(
                        path,
                        content=body,
                        headers={"authorization": f"Bearer {keys[key]}", "content-type": "application/json"},
                    )
                except httpx.HTTPError as exc:  # no answer at all: the case fails, the run goes on
                    answers[name] = (0, f"{type(exc).__name__}: {exc}")
                else:
                    answers[name] = (r.status_code, r.text[:300])
    finally:
        gateway.drop_session(closed)
    return answers


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    tmp = tmp_path_factory.mktemp("hostile")
    with pytest.MonkeyPatch.context() as mp:
        spy = LoopSpy().install(mp)
        held: dict[str, Any] = {}

        async def hostile_while_held(prompt: Sequence[int], session_id: str) -> None:
            if spy.current_step == 2 and not held:
                held["session"] = session_id
                held["answers"] = await _send_all(spy, session_id)

        hook_sampler(mp, hostile_while_held)
        cfg, plugins = fault_config(tmp, "trainer.max_steps=2")
        code, backend = run_loop(cfg, plugins)
    return HostileRun(
        code, backend, spy, Path(str(cfg.run_dir)), held.get("session", ""), held.get("answers", {})
    )


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_mid_step_gets_a_4xx(hostile_run: HostileRun, case: str) -> None:
    status, text = hostile_run.answers[case]
    assert status == EXPECTED[case], (case, status, text)
    assert '"error"' in text, text  # the dialect's error envelope, not a bare page


def test_the_step_with_bad_input_is_unaffected(hostile_run: HostileRun) -> None:
    run = hostile_run
    assert run.code == 0 and run.live_session
    records = step_records(run.run_dir)
    for n in (1, 2):
        assert statuses(run.spy.step(n).outcomes) == ["ok"] * 4
        assert_metrics_match(records[n], run.spy.step(n).outcomes)
        assert records[n]["faults/sampler_errors"] == 0
    live = next(o for o in run.spy.step(2).outcomes if o.request.session_id == run.live_session)
    # its one turn was recorded and is the one trained, bad requests left no turns behind
    assert live.ok and live.faults["model_turns"] == 1 and len(live.rows) == 1
    signal = run.spy.step(2).signal
    assert signal is not None
    assert (live.request.rollout_id, 0) in signal.sources
    assert_trained_only_ok(run.spy, run.backend)


def test_a_5mb_body_is_refused_after_tokenizing_a_few_pieces_with_the_tiny_tokenizer() -> None:
    """The embedded tiny tokenizer covers only the task's characters, so it gets no
    length bound (``max_token_chars`` is None) and used to tokenize a 5.4 MB
    count_tokens body in full (about 40 s here) before its 400. Checked on the
    renderer, by what it tokenizes, not by timing."""
    from core.gateway.render import ChatRenderer, PromptTooLong
    from core.tokenizer import build_tiny_tokenizer

    renderer = ChatRenderer(build_tiny_tokenizer())
    assert renderer.max_token_chars is None
    encoded: list[int] = []
    real_encode = renderer.encode

    def counting_encode(text: str) -> list[int]:
        encoded.append(len(text))
        return real_encode(text)

    renderer.encode = counting_encode  # type: ignore[method-assign]
    body = [{"role": "user", "content": "After 3? " * 600_000}]
    with pytest.raises(PromptTooLong):
        renderer.count(body, None, limit=4096)
    assert 0 < sum(encoded) <= 200_000  # a few pieces of the 5.4 M characters

    # A prompt near the limit is left to the exact count, never refused by the pieces.
    encoded.clear()
    # The tokenizer drops characters it does not know: 21 characters per token here.
    near = [{"role": "user", "content": ("\U0001f642" * 20 + "a") * 10_000}]
    exact = len(real_encode(renderer.render_text(near, None, add_generation_prompt=True)))
    assert renderer.count(near, None, limit=exact) == exact
    assert sum(encoded) >= 210_000  # it was counted in pieces, then exactly

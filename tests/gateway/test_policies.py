"""A policy per sub-agent, first slice: turns routed to policies by the ``model`` they send.

The real gateway on uvicorn, driven by the official openai and anthropic SDKs; the
sampler is scripted (the model is the one thing a test cannot script otherwise).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from core.errors import ConfigError
from core.gateway import Gateway, GatewayConfig
from core.gateway.policies import PolicyRoutes
from core.rollout import RolloutOutcome
from core.rundir.traces import (
    TraceWriter,
    conversation_tree,
    decode_turn,
    encode_turn,
    read_traces,
    rows_of,
    trace_path,
)
from core.samplers import ScriptedSampler
from core.types import (
    DEFAULT_POLICY,
    FinishReason,
    PolicySampling,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SamplingParams,
    TraceRecord,
    TurnSpan,
)
from tests.gateway.conftest import Harness, _serve

ROUTES = PolicyRoutes(names=("planner", "coder"), models={"gpt-planner": "planner", "claude-coder": "coder"})
"""Two policies; ``planner`` (listed first) is the sessions' default."""


@pytest.fixture
def make_routed(byte_tokenizer: Any) -> Iterator[Callable[..., Harness]]:
    """``make_routed(policies, config)``: a served gateway (model id ``tiny``) with those routes."""
    made: list[Harness] = []

    def make(policies: PolicyRoutes | None = ROUTES, config: GatewayConfig | None = None) -> Harness:
        sampler = ScriptedSampler(tokenizer=byte_tokenizer)
        gw = Gateway(
            tokenizer=byte_tokenizer, sampler=sampler, config=config or GatewayConfig(), model_id="tiny",
            policies=policies,
        )
        server, loop, close = _serve(gw)
        h = Harness(gw, sampler, server, byte_tokenizer, loop, [close])
        made.append(h)
        return h

    yield make
    for h in made:
        for client in h.clients:
            client.close()
        for close in h.closers:
            close()


def _finish(h: Harness, sid: str) -> list[TraceRecord]:
    rows: list[TraceRecord] = h.call(h.gw.finish_session, sid)
    for row in rows:
        row.validate()
    return rows


def _policies(rows: list[TraceRecord]) -> list[list[str]]:
    return [[t.policy for t in row.turns] for row in rows]


def test_one_policy_keeps_todays_model_handling(harness: Harness) -> None:
    """No ``policies``: any model name is served (as before) and every turn is the default policy's."""
    h = harness
    h.push("a", "b")
    sid = h.session()
    client = h.openai(sid)
    for model in ("gpt-4o", "whatever-name"):
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": model}])
        assert out.model == "tiny"
    rows = _finish(h, sid)
    assert _policies(rows) == [[DEFAULT_POLICY]] * len(rows)
    assert all(row.policy() == DEFAULT_POLICY for row in rows)


def test_a_single_named_policy_takes_every_turn(make_routed: Callable[..., Harness]) -> None:
    h = make_routed(PolicyRoutes(names=("solver",)))
    h.push("a")
    sid = h.session()
    h.openai(sid).chat.completions.create(model="not-a-policy", messages=[{"role": "user", "content": "x"}])
    assert _policies(_finish(h, sid)) == [["solver"]]


def test_turns_route_by_model_name_or_the_sessions_policy(make_routed: Callable[..., Harness]) -> None:
    """Separate conversations (sub-agents) in one session: each turn lands in the policy its model names."""
    h = make_routed()
    h.push("p1", "c1", "p2", "c2", "d1")
    sid = h.session(history_mode="tree")
    client = h.openai(sid)
    for model, text in [("gpt-planner", "plan"), ("coder", "code"), ("planner", "plan2"), ("claude-coder", "code2")]:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "own model id"}])
    rows = _finish(h, sid)
    assert _policies(rows) == [["planner"], ["coder"], ["planner"], ["coder"], ["planner"]]

    h.push("c3")
    other = h.session(policy="coder")  # the session's own policy takes the gateway's model id
    h.openai(other).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert _policies(_finish(h, other)) == [["coder"]]


def test_models_lists_every_name_a_request_may_send(make_routed: Callable[..., Harness], harness: Harness) -> None:
    h = make_routed()
    sid = h.session()
    listed = [m.id for m in h.openai(sid).models.list()]
    assert listed == ["tiny", "planner", "coder", "gpt-planner", "claude-coder"]
    assert [m.id for m in harness.openai(harness.session()).models.list()] == ["tiny"]  # one policy: as before


def test_anthropic_requests_route_too(make_routed: Callable[..., Harness]) -> None:
    h = make_routed()
    h.push("c1")
    sid = h.session()
    h.anthropic(sid).messages.create(model="claude-coder", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    assert _policies(_finish(h, sid)) == [["coder"]]


def test_an_unknown_model_is_a_400_naming_the_policies(make_routed: Callable[..., Harness]) -> None:
    h = make_routed()
    h.push("never served")
    sid = h.session()
    with pytest.raises(openai.BadRequestError) as err:
        h.openai(sid).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    message = str(err.value)
    assert err.value.status_code == 400
    assert "'gpt-4o' names no policy" in message
    for name in ("planner", "coder", "gpt-planner", "claude-coder"):
        assert name in message
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == "model" and body.get("code") == "model_not_found"
    with pytest.raises(anthropic.BadRequestError, match="names no policy"):
        h.anthropic(sid).messages.create(model="opus", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert h.call(lambda: h.gw.session(sid).turns) == []  # nothing recorded, nothing sampled
    assert len(h.sampler.calls) == 0


def test_an_unknown_session_policy_is_refused(make_routed: Callable[..., Harness]) -> None:
    h = make_routed()
    with pytest.raises(Exception, match=r"unknown policy 'critic'; this gateway serves \['planner', 'coder'\]"):
        h.session(policy="critic")


@pytest.mark.parametrize("mode", ["linear", "tree"])
def test_a_change_of_policy_in_one_conversation_starts_a_new_row(
    make_routed: Callable[..., Harness], mode: str
) -> None:
    """planner, planner, coder, planner on one growing conversation: three rows, none mixed.
    The same conversation on one policy packs into one row (so the split is the policy's doing)."""

    def converse(h: Harness, models: list[str]) -> list[TraceRecord]:
        h.push("one", "two", "three", "four")
        sid = h.session(history_mode=mode)
        client = h.openai(sid)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
        for i, model in enumerate(models):
            out = client.chat.completions.create(model=model, messages=messages)
            messages += [{"role": "assistant", "content": out.choices[0].message.content}, {"role": "user", "content": f"next {i}"}]
        return _finish(h, sid)

    h = make_routed()
    one_policy = converse(h, ["planner"] * 4)
    assert _policies(one_policy) == [["planner"] * 4]

    mixed = converse(h, ["planner", "planner", "coder", "planner"])
    assert _policies(mixed) == [["planner", "planner"], ["coder"], ["planner"]]
    # Each row is exactly what its own policy generated: the later rows start from a fresh render,
    # with the earlier turns as context (mask 0), not trained again.
    assert [row.num_generated for row in mixed] == [
        sum(t.end - t.start for t in row.turns) for row in mixed
    ]
    assert mixed[2].prompt_length > mixed[1].prompt_length > mixed[0].prompt_length


def test_a_row_of_two_policies_does_not_validate() -> None:
    row = TraceRecord(
        session_id="s", token_ids=[1, 2, 3, 4], loss_mask=[0, 1, 0, 1], logprobs=[0.0, -0.1, 0.0, -0.2],
        prompt_length=1,
        turns=[TurnSpan(1, 2, FinishReason.STOP, 0, policy="planner"), TurnSpan(3, 4, FinishReason.STOP, 0, policy="coder")],
    )
    with pytest.raises(ValueError, match=r"policies \['coder', 'planner'\]; a row holds the turns of one policy"):
        row.validate()


def test_each_turns_policy_is_in_the_trace_jsonl(make_routed: Callable[..., Harness], tmp_path: Path) -> None:
    """The stored trace (gzip'd JSONL) carries each turn's policy; ``read_traces`` gives it back."""
    h = make_routed()
    h.push("p", "c")
    sid = h.session(history_mode="tree", metadata={"rollout_id": "r0", "group_id": "g0"})
    client = h.openai(sid)
    client.chat.completions.create(model="planner", messages=[{"role": "user", "content": "a"}])
    client.chat.completions.create(model="coder", messages=[{"role": "user", "content": "b"}])
    conversation = h.call(lambda: conversation_tree(h.gw.session(sid).root, h.gw.session(sid).turns))
    rows = _finish(h, sid)

    request = RolloutRequest(
        rollout_id="r0", group_id="g0", payload={}, base_url=h.server.base_url, session_id=sid, model_id="tiny"
    )
    outcome = RolloutOutcome(
        request, RolloutResult(rollout_id="r0", status=RolloutStatus.OK, reward=1.0), rows, conversation=conversation
    )
    TraceWriter(tmp_path, 1, h.gw.renderer.decode).write_step(0, [outcome], {"r0": 0.0}, weight_version=0)
    path = trace_path(tmp_path, "train", 0)
    lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    stored = [turn for line in lines[1:] for row in line["rows"] for turn in row["turns"]]
    assert [turn[-1].get("policy") for turn in stored] == ["planner", "coder"]
    (back,) = read_traces(path).rollouts
    assert [node.get("policy") for node in back["conversation"] if node["turn"] is not None] == ["planner", "coder"]
    assert [[t.policy for t in row.turns] for row in rows_of(back)] == [["planner"], ["coder"]]


def test_traces_without_policies_read_as_the_default_policy() -> None:
    """Turns written before turns recorded a policy (four items, or named fields without it)."""
    assert decode_turn([0, 3, "stop", 2]).policy == DEFAULT_POLICY
    assert decode_turn([0, 3, "stop", 2, {"parse": "no_tools"}]).policy == DEFAULT_POLICY
    default = TurnSpan(0, 3, FinishReason.STOP, 2)
    assert encode_turn(default) == [0, 3, "stop", 2]  # the default policy costs no bytes
    named = TurnSpan(0, 3, FinishReason.STOP, 2, policy="coder")
    assert decode_turn(encode_turn(named)) == named


def test_each_policy_samples_with_its_own_sampler_and_weight_version(
    make_routed: Callable[..., Harness], byte_tokenizer: Any
) -> None:
    """The trainer hands the gateway a sampler per policy (``set_sampler(..., policy=)``): a turn
    is sampled by its policy's and records that policy's weight version."""
    h = make_routed()
    coder = ScriptedSampler(tokenizer=byte_tokenizer, weight_version=7)
    h.call(h.gw.set_sampler, coder, policy="coder")
    assert h.gw.sampler_of("coder") is coder and h.gw.sampler_of("planner") is h.sampler is h.gw.sampler
    h.push("plan")
    coder.push(h.reply("code"))
    sid = h.session(history_mode="tree")
    client = h.openai(sid)
    planned = client.chat.completions.create(model="planner", messages=[{"role": "user", "content": "a"}])
    coded = client.chat.completions.create(model="coder", messages=[{"role": "user", "content": "a"}])
    assert (planned.choices[0].message.content, coded.choices[0].message.content) == ("plan", "code")
    assert len(h.sampler.calls) == len(coder.calls) == 1
    rows = _finish(h, sid)
    assert [(row.policy(), row.turns[0].weight_version) for row in rows] == [("planner", 0), ("coder", 7)]
    with pytest.raises(ConfigError, match=r"unknown policy 'critic'"):
        h.gw.set_sampler(coder, policy="critic")


def test_each_policy_samples_with_its_own_sampling_defaults(make_routed: Callable[..., Harness]) -> None:
    """A session's ``by_policy`` (a run's per-policy temperature, top_p, max_tokens): a turn routed
    to ``coder`` is sampled with coder's, a turn of ``planner`` (the session's default) with the
    session's; each turn records what it was sampled with, and no sampler sees ``by_policy``."""
    h = make_routed()
    h.push("p1", "c1", "p2")
    coder = PolicySampling(temperature=0.3, top_p=0.9, top_k=5, max_tokens=4)
    sampling = SamplingParams(max_tokens=16, temperature=1.0, seed=11, by_policy=(("coder", coder),))
    sid = h.session(history_mode="tree", sampling=sampling)
    client = h.openai(sid)
    for model in ("planner", "coder", "gpt-planner"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": model}])
    sent = [(c.params.temperature, c.params.top_p, c.params.top_k, c.params.max_tokens) for c in h.sampler.calls]
    assert sent == [(1.0, 1.0, -1, 16), (0.3, 0.9, 5, 4), (1.0, 1.0, -1, 16)]
    assert all(c.params.by_policy == () for c in h.sampler.calls)
    assert all(c.params.seed is not None for c in h.sampler.calls)  # the session's seed stays
    rows = _finish(h, sid)
    recorded = [(row.policy(), row.metadata["turn_params"][0]["temperature"]) for row in rows]
    assert recorded == [("planner", 1.0), ("coder", 0.3), ("planner", 1.0)]


def test_sampling_for_a_policy_replaces_only_its_own_settings() -> None:
    own = PolicySampling(temperature=0.5, top_p=0.8, top_k=3, max_tokens=2)
    base = SamplingParams(max_tokens=9, stop=("x",), seed=4, by_policy=(("coder", own),))
    assert base.for_policy("coder") == SamplingParams(
        max_tokens=2, temperature=0.5, top_p=0.8, top_k=3, stop=("x",), seed=4
    )
    assert base.for_policy("planner") == SamplingParams(max_tokens=9, stop=("x",), seed=4)
    plain = SamplingParams()
    assert plain.for_policy("coder") is plain

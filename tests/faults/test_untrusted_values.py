"""Values from a dataset, an agent, the model or a sampler that could stop or poison a run
(issue #29): integers of 2**64 and more and nesting deeper than 254 (JSON allows them,
orjson cannot write them) never stop a step's trace write (the trace keeps what it can and
the run goes on); a sampler's NaN or infinite logprob is refused before it is recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.rollout import RolloutOutcome
from core.rundir.traces import (
    STORED_DEPTH,
    TRUNCATED,
    TraceWriter,
    conversation_tree,
    read_traces,
    rows_of,
    trace_path,
)
from core.samplers import encode_reply
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SampleResult,
    SamplingParams,
    TraceRecord,
)
from tests.gateway.conftest import CALC_TOOL, Harness

BIG = 2**64 + 2


def _nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth - 1):
        node["k"] = {}
        node = node["k"]
    return root


def _depth(value: Any) -> int:
    depth = 0
    while isinstance(value, dict) and value:
        value, depth = value.get("k", value.get("expression")), depth + 1
    return depth


def _outcome(
    payload: dict[str, Any],
    rows: list[TraceRecord] | None = None,
    conversation: list[dict[str, Any]] | None = None,
    metrics: dict[str, Any] | None = None,
) -> RolloutOutcome:
    request = RolloutRequest(
        rollout_id="r0", group_id="g0", payload=payload, base_url="http://x/v1", session_id="s", model_id="m"
    )
    result = RolloutResult(rollout_id="r0", status=RolloutStatus.OK, reward=1.0, elapsed_s=0.1, metrics=metrics or {})
    return RolloutOutcome(request=request, result=result, rows=rows or [], conversation=conversation or [])


def test_big_ints_and_deep_nesting_are_stored_not_fatal(tmp_path: Path) -> None:
    outcome = _outcome(
        {"answer": BIG, "small": -(2**63), "deep": _nested(300), "list": [[-(2**70)]]},
        conversation=[{"parent": -1, "messages": [{"role": "user", "content": "x", "extra": _nested(300)}],
                       "turn": None}],
        metrics={"count": 2**70},
    )
    stats = TraceWriter(tmp_path, 1).write_step(1, [outcome], {"r0": 0.5})
    assert stats["traces/bytes"] > 0
    (stored,) = read_traces(trace_path(tmp_path, "train", 1)).rollouts
    assert stored["payload"]["answer"] == str(BIG)
    assert stored["payload"]["small"] == -(2**63)  # in range: still an integer
    assert stored["payload"]["list"] == [[str(-(2**70))]]
    assert stored["metrics"] == {"count": str(2**70)}
    assert stored["reward"] == 1.0 and stored["advantage"] == 0.5 and stored["status"] == "ok"
    deep = stored["payload"]["deep"]
    assert 150 < _depth(deep) <= STORED_DEPTH
    node = deep
    while isinstance(node, dict):
        node = node["k"]
    assert node == TRUNCATED
    extra = stored["conversation"][0]["messages"][0]["extra"]
    assert stored["conversation"][0]["messages"][0]["content"] == "x" and _depth(extra) < 255


def test_a_record_orjson_writes_as_is_is_unchanged(tmp_path: Path) -> None:
    """The fallback only runs for records orjson refuses: 2**64 - 1 and 250 levels are fine."""
    outcome = _outcome({"u64": 2**64 - 1, "deep": _nested(250)})
    TraceWriter(tmp_path, 1).write_step(1, [outcome], {})
    (stored,) = read_traces(trace_path(tmp_path, "train", 1)).rollouts
    assert stored["payload"] == {"u64": 2**64 - 1, "deep": _nested(250)}


def _post(h: Harness, path: str, sid: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        h.server.root_url + path, content=json.dumps(body).encode(), timeout=60,
        headers={"authorization": f"Bearer {sid}", "content-type": "application/json"},
    )


def _write_session(h: Harness, sid: str, tmp_path: Path, step: int) -> dict[str, Any]:
    """Store the session's conversation and rows as a training step does; the stored record."""
    session = h.gw.session(sid)
    conversation = conversation_tree(session.root, session.turns)
    rows = h.call(h.gw.peek_rows, sid)
    outcome = _outcome({"id": BIG}, rows=rows, conversation=conversation)
    stats = TraceWriter(tmp_path, 1, decode=h.tok.decode).write_step(step, [outcome], {})
    assert stats["traces/bytes"] > 0
    (stored,) = read_traces(trace_path(tmp_path, "train", step)).rollouts
    assert [r.token_ids for r in rows_of(stored)] == [r.token_ids for r in rows]
    assert stored["payload"] == {"id": str(BIG)}
    return stored


def test_agent_and_model_values_through_the_gateway_reach_the_trace(harness: Harness, tmp_path: Path) -> None:
    """A model-written call with 2**70 in its arguments, then an agent sending back a tool call
    whose arguments nest 300 deep: the gateway answers both, and the session's trace is
    written after each (the integer as a string, the nesting truncated), its rows intact."""
    h = harness
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": ' + str(2**70) + "}}\n</tool_call>"
    h.push(call, "done")
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    first = _post(h, "/v1/chat/completions", sid, {"model": "tiny", "messages": messages, "tools": [CALC_TOOL]})
    assert first.status_code == 200, first.text
    (tc,) = first.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"expression": 2**70}
    stored = _write_session(h, sid, tmp_path, 1)
    assert str(2**70) in json.dumps(stored["conversation"])
    # the agent sends the call back with arguments of its own, as an object nested 300 deep
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": tc["id"], "type": "function", "function": {"name": "calculator", "arguments": _nested(300)}}]})
    messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "big"})
    second = _post(h, "/v1/chat/completions", sid, {"model": "tiny", "messages": messages, "tools": [CALC_TOOL]})
    assert second.status_code == 200, second.text
    stored = _write_session(h, sid, tmp_path, 2)
    assert TRUNCATED in json.dumps(stored["conversation"])


class _BadLogprobSampler:
    """Returns "ok" with one logprob replaced by ``bad``."""

    def __init__(self, tok: Any, bad: float) -> None:
        self.tok, self.bad = tok, bad

    async def sample(self, prompt_token_ids: Any, params: SamplingParams, *, session_id: str) -> SampleResult:
        ids = encode_reply(self.tok, "ok")
        logprobs = [-0.5] * len(ids)
        logprobs[1] = self.bad
        return SampleResult(ids, logprobs, FinishReason.STOP, 0)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_sampler_s_non_finite_logprob_is_refused(make_harness: Any, byte_tokenizer: Any, bad: float) -> None:
    h = make_harness(sampler=_BadLogprobSampler(byte_tokenizer, bad))
    sid = h.session()
    r = _post(h, "/v1/chat/completions", sid, {"model": "tiny", "messages": [{"role": "user", "content": "go"}]})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "sampler_error" and "logprobs must be finite" in error["message"]
    assert repr(bad) in error["message"]
    session = h.gw.session(sid)
    assert session.counters["sampler_errors"] == 1 and session.turns == []
    assert h.call(h.gw.finish_session, sid) == []

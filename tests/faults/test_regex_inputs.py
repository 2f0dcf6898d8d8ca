"""Client-supplied regexes never run unbounded (issue #29): a strict tool schema's ``pattern``
and the ``match`` reward's ``reward.pattern`` are matched by RE2, in time linear in the text.

With Python's ``re``, ``^(a+)+$`` against 29 ``a`` and a ``!`` took tens of seconds on the
gateway's event loop, and ``/health`` waited for it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from core.errors import ConfigError
from core.rewards.base import RewardInput
from core.rewards.builtin import MatchReward, MatchRewardConfig
from core.types import RolloutResult, RolloutStatus, SamplingParams
from tests.gateway.conftest import Harness

EVIL = "^(a+)+$"
SUBJECT = "a" * 29 + "!"


def _tool(pattern: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}, "required": ["x"]}
    return {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}


def _post(h: Harness, sid: str, body: dict[str, Any], timeout: float = 120) -> httpx.Response:
    return httpx.post(
        h.server.base_url + "/chat/completions", content=json.dumps(body).encode(), timeout=timeout,
        headers={"authorization": f"Bearer {sid}", "content-type": "application/json"},
    )


def test_a_strict_pattern_is_matched_in_linear_time_and_health_stays_up(harness: Harness) -> None:
    h = harness
    h.push('<tool_call>\n{"name": "f", "arguments": {"x": "' + SUBJECT + '"}}\n</tool_call>')
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    done: dict[str, Any] = {}

    def call() -> None:
        t0 = time.perf_counter()
        r = _post(h, sid, {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": [_tool(EVIL)]})
        done["response"], done["seconds"] = r, time.perf_counter() - t0

    worker = threading.Thread(target=call)
    worker.start()
    health: list[float] = []
    while worker.is_alive() and len(health) < 50:
        t0 = time.perf_counter()
        assert httpx.get(h.server.root_url + "/health", timeout=30).status_code == 200
        health.append(time.perf_counter() - t0)
    worker.join(120)
    response = done["response"]
    assert response.status_code == 200, response.text
    assert done["seconds"] < 5, done
    assert max(health, default=0.0) < 2, health
    message = response.json()["choices"][0]["message"]
    assert "tool_calls" not in message  # the call does not fit the pattern: returned as text
    assert h.call(h.gw.finish_session, sid)[-1].metadata["strict_violations"] == 1


def test_a_fitting_call_still_fits_with_re2() -> None:
    from core.gateway.strict import split_strict, strict_schemas

    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": r"^\d+$"}},
              "patternProperties": {"^y_": {"type": "integer"}}, "additionalProperties": False}
    schemas = strict_schemas([{"type": "function", "function": {"name": "f", "strict": True, "parameters": schema}}])
    calls = [("f", {"x": "12", "y_1": 3}), ("f", {"x": "1a"}), ("f", {"x": "1", "z": 1}), ("f", {"y_a": "s"})]
    assert split_strict(schemas, calls) == ([("f", {"x": "12", "y_1": 3})], 3)


@pytest.mark.parametrize("pattern", [r"^(a)\1$", r"^(?=a)a$", r"(?<!b)a"])
def test_a_pattern_re2_cannot_run_is_a_clear_400(harness: Harness, pattern: str) -> None:
    h = harness
    sid = h.session()
    r = _post(h, sid, {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": [_tool(pattern)]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools"
    assert "'f'" in error["message"] and repr(pattern) in error["message"] and "RE2" in error["message"]


def _item(answer: str) -> RewardInput:
    return RewardInput(
        rollout_id="r", group_id="g", payload={"answer": "x"},
        result=RolloutResult("r", RolloutStatus.OK, reward=0.0), rows=[],
        conversation=[{"parent": -1, "messages": [{"role": "assistant", "content": answer}], "turn": 0}],
    )


def test_the_match_reward_s_regex_runs_in_linear_time() -> None:
    reward = MatchReward(MatchRewardConfig(pattern=EVIL, answer_key=""))
    t0 = time.perf_counter()
    out = asyncio.run(reward.score([_item(SUBJECT), _item("aaa")]))
    assert time.perf_counter() - t0 < 2
    assert [o.reward for o in out] == [0.0, 1.0]
    grouped = MatchReward(MatchRewardConfig(pattern=r"answer: (\w+)"))
    assert [o.reward for o in asyncio.run(grouped.score([_item("the answer: x"), _item("answer: y")]))] == [1.0, 0.0]
    with pytest.raises(ConfigError, match="RE2"):
        MatchReward(MatchRewardConfig(pattern=r"(a)\1"))

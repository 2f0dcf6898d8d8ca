"""``POST /admin/sessions/{sid}/harvest`` gives exactly what the in-process harvest gives.

The trainer reads a gateway shard in another process through this route
(docs/scale.md), so rows, counters and the conversation must survive the trip
unchanged. Real uvicorn on 127.0.0.1, the official openai SDK as the agent; the
model is scripted.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from core.gateway.harvest import harvest_from_json, harvest_session
from tests.gateway.conftest import CALC_TOOL, Harness


def _agent(h: Harness, sid: str) -> None:
    """A tool call, its result, an answer."""
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 12 * 7?"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC_TOOL])
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    call = first.choices[0].message.tool_calls[0]
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "84"})
    client.chat.completions.create(model="tiny", messages=messages, tools=[CALC_TOOL])


def _no_call_ids(conversation: list[dict[str, Any]]) -> str:
    """The conversation as JSON with its tool-call ids (fresh random ones per session) blanked."""
    return re.sub(r'"call_[0-9a-f]+"', '"call_"', json.dumps(conversation, sort_keys=True))


def _admin(h: Harness, method: str, path: str) -> httpx.Response:
    return httpx.request(
        method, h.server.root_url + path, headers={"authorization": f"Bearer {h.server.admin_token}"}, timeout=10
    )


def test_harvest_route_equals_in_process_harvest(harness: Harness) -> None:
    h = harness
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    h.push(call, "84.", call, "84.")
    here, there = h.session(metadata={"rollout_id": "r"}), h.session(metadata={"rollout_id": "r"})
    _agent(h, here)
    _agent(h, there)
    local = h.call(harvest_session, h.gw, here)
    resp = _admin(h, "POST", f"/admin/sessions/{there}/harvest")
    assert resp.status_code == 200, resp.text
    remote = harvest_from_json(resp.json())
    assert local is not None and local.rows and local.counters["model_turns"] == 2
    assert remote.counters == local.counters
    assert _no_call_ids(remote.conversation) == _no_call_ids(local.conversation)
    assert (remote.finished_early, remote.lost) == (False, False)
    assert len(remote.rows) == len(local.rows)
    for a, b in zip(remote.rows, local.rows, strict=True):
        b.session_id = a.session_id
        assert a == b
        a.validate()
    # Harvest drops the session: the agent's key is refused, and a second harvest is a 401.
    assert _admin(h, "POST", f"/admin/sessions/{there}/harvest").status_code == 401
    assert h.call(harvest_session, h.gw, here) is None


def test_harvest_of_a_session_finished_early_keeps_its_rows(harness: Harness) -> None:
    h = harness
    h.push("hi")
    sid = h.session()
    h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
    assert _admin(h, "POST", f"/admin/sessions/{sid}/finish").status_code == 200
    got = harvest_from_json(_admin(h, "POST", f"/admin/sessions/{sid}/harvest").json())
    assert got.finished_early and len(got.rows) == 1 and got.rows[0].num_generated > 0


def test_sampler_route_sets_the_version_and_retires_servers(make_harness: Any) -> None:
    """``POST /admin/sampler``: what a gateway shard's HTTP sampler learns after each weight push
    (no server is contacted: the pool's health checks are off)."""
    from core.samplers import HttpSamplerConfig, build_http_sampler

    sampler = build_http_sampler(HttpSamplerConfig(
        kind="sglang", urls=["http://127.0.0.1:9/", "http://127.0.0.1:10"], health_interval_s=0,
    ))
    h = make_harness(sampler=sampler)
    resp = httpx.post(
        h.server.root_url + "/admin/sampler", headers={"authorization": f"Bearer {h.server.admin_token}"},
        json={"weight_version": 4, "retired": {"http://127.0.0.1:9": "its logprobs differ"}}, timeout=10,
    )
    assert resp.status_code == 200, resp.text
    assert sampler.weight_version == 4
    assert [s.url for s in sampler.pool.servers] == ["http://127.0.0.1:10"]
    assert "retired by the trainer: its logprobs differ" in sampler.pool.retired[0].last_error
    bad = httpx.post(
        h.server.root_url + "/admin/sampler", headers={"authorization": f"Bearer {h.server.admin_token}"},
        json={"weight_version": "5"}, timeout=10,
    )
    assert bad.status_code == 400 and "weight_version" in bad.text

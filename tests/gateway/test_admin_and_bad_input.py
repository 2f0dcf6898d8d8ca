"""Admin routes (token required) and bad input: every case is a 4xx with a message, never a 500."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.gateway import GatewayConfig
from tests.gateway.conftest import Harness


def _admin(h: Harness, token: str | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {token if token is not None else h.server.admin_token}"}


def test_admin_session_lifecycle_over_http(harness: Harness) -> None:
    h = harness
    h.push("hello")
    root = h.server.root_url
    made = httpx.post(
        root + "/admin/sessions",
        headers=_admin(h),
        json={"sampling": {"max_tokens": 16, "temperature": 0.5}, "metadata": {"rollout_id": "r9"},
              "history_mode": "tree"},
    ).json()
    sid = made["session_id"]
    assert made["base_url"] == h.server.base_url
    assert len(sid) >= 22  # >= 128 bits of randomness
    out = h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "hello"
    info = httpx.get(f"{root}/admin/sessions/{sid}", headers=_admin(h)).json()
    assert info["turns"] == 1 and info["history_mode"] == "tree" and info["sampling"]["temperature"] == 0.5
    peek = httpx.get(f"{root}/admin/sessions/{sid}/trace", headers=_admin(h)).json()["rows"]
    assert peek[0]["rollout_id"] == "r9" and sum(peek[0]["loss_mask"]) == len(h.reply("hello"))
    assert peek[0]["turns"][0]["finish_reason"] == "stop"
    rows = httpx.post(f"{root}/admin/sessions/{sid}/finish", headers=_admin(h)).json()["rows"]
    assert rows == peek
    again = httpx.post(f"{root}/admin/sessions/{sid}/finish", headers=_admin(h))
    assert again.status_code == 409
    assert httpx.delete(f"{root}/admin/sessions/{sid}", headers=_admin(h)).json() == {"dropped": True}
    assert httpx.get(f"{root}/admin/sessions/{sid}", headers=_admin(h)).status_code == 401


def test_admin_posts_a_late_reward(harness: Harness) -> None:
    """``POST /admin/rollouts/{id}/reward`` delivers a pending reward; an unknown id is a
    404 and a non-number a 400, each naming what was wrong (docs/eval.md, "Late rewards")."""
    h = harness
    url = h.server.root_url + "/admin/rollouts/{}/reward"
    late = h.gw.late_rewards
    h.call(late.expect, "r1")
    unknown = httpx.post(url.format("r2"), headers=_admin(h), json={"reward": 1.0})
    assert unknown.status_code == 404 and "no running or pending rollout has id 'r2'" in unknown.text
    for body in ({"reward": "high"}, {"reward": None}, {}, {"reward": 1, "extra": 2}):
        bad = httpx.post(url.format("r1"), headers=_admin(h), json=body)
        assert bad.status_code == 400 and "invalid reward" in bad.text, body
    assert httpx.post(url.format("r1"), headers=_admin(h), json={"reward": 0.5}).status_code == 200
    assert httpx.post(url.format("r1"), json={"reward": 0.5}).status_code == 401
    assert asyncio.run_coroutine_threadsafe(late.wait("r1", 0.0), h.loop).result(10) == 0.5
    gone = httpx.post(url.format("r1"), headers=_admin(h), json={"reward": 0.5})
    assert gone.status_code == 404  # its wait is over
    # Only a shard hands posted rewards over to a trainer; here they reached the rollout.
    take = httpx.post(h.server.root_url + "/admin/late_rewards/take", headers=_admin(h))
    assert take.status_code == 404 and "not a shard" in take.text


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"authorization": "Bearer wrong"}, 403), ({"x-admin-token": "wrong"}, 403)],
)
def test_admin_needs_the_token(harness: Harness, headers: dict[str, str], status: int) -> None:
    r = httpx.post(harness.server.root_url + "/admin/sessions", headers=headers, json={})
    assert r.status_code == status
    assert "admin token" in r.json()["error"]["message"]
    assert harness.gw.sessions() == []


def test_admin_rejects_bad_settings(harness: Harness) -> None:
    r = httpx.post(harness.server.root_url + "/admin/sessions", headers=_admin(harness),
                   json={"sampling": {"max_tokens": 0}})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(harness.server.root_url + "/admin/sessions", headers=_admin(harness), json={"bogus": 1})
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]


BAD_BODIES: list[tuple[Any, str]] = [
    (b"{not json", "not valid JSON"),
    (b"", "empty"),
    (b"[1, 2]", "JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1' + b"0" * 500 + b"}", "temperature"),
    (b"\xff\xfe{}", "not valid JSON"),
    ({"model": "tiny"}, "'messages' is required"),
    ({"messages": []}, "at least one message"),
    ({"messages": "hi"}, "must be a list"),
    ({"messages": [1]}, "messages[0] must be an object"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
    ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages[0].name must be a string"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "10"}, "'max_tokens' must be an integer"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "'max_tokens' must be >= 1"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "'temperature' must be in"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "'stream' must be true or false"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 3}, "'n' must be 1"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, "tool_calls[0]"),
]


@pytest.mark.parametrize(("body", "needle"), BAD_BODIES)
def test_bad_openai_bodies_are_400_with_message(harness: Harness, body: Any, needle: str) -> None:
    sid = harness.session()
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(harness.server.base_url + "/chat/completions", content=content,
                   headers={"authorization": f"Bearer {sid}", "content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert harness.gw.session(sid).turns == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "'max_tokens' is required"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "expected 'user' or 'assistant'"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "type 'image'"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124", "name": "b"}]},
         "only custom tools"),
    ],
)
def test_bad_anthropic_bodies(harness: Harness, body: dict[str, Any], needle: str) -> None:
    sid = harness.session()
    r = httpx.post(harness.server.root_url + "/v1/messages", json=body, headers={"x-api-key": sid})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and needle in r.json()["error"]["message"]


def test_oversized_body_is_413(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(max_body_bytes=1000))
    sid = h.session()
    body = {"messages": [{"role": "user", "content": "x" * 2000}]}
    r = httpx.post(h.server.base_url + "/chat/completions", json=body, headers={"authorization": f"Bearer {sid}"})
    assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]


def test_missing_key_unknown_route_and_wrong_method(harness: Harness) -> None:
    base = harness.server.base_url
    r = httpx.post(base + "/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401 and "no session id" in r.json()["error"]["message"]
    r = httpx.post(base + "/completions", json={})
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = httpx.get(base + "/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_tools_without_parser_are_refused(make_harness: Any) -> None:
    h = make_harness(GatewayConfig(tool_parser="none"))
    sid = h.session()
    body = {"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    r = httpx.post(h.server.base_url + "/chat/completions", json=body, headers={"authorization": f"Bearer {sid}"})
    assert r.status_code == 400 and "no tool-call parser" in r.json()["error"]["message"]


def test_sampler_failure_is_503(harness: Harness) -> None:
    sid = harness.session()  # the scripted sampler has nothing queued and no default
    r = httpx.post(harness.server.base_url + "/chat/completions", headers={"authorization": f"Bearer {sid}"},
                   json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503 and "sampling backend failed" in r.json()["error"]["message"]
    assert harness.gw.session(sid).counters["sampler_errors"] == 1


_json_leaf = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "x", 3, None])
_message = st.fixed_dictionaries(
    {"role": _roles},
    optional={"content": _json | st.text(max_size=30), "tool_calls": _json, "tool_call_id": _json},
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(_message, max_size=4) | _json,
        "model": _json,
        "max_tokens": _json,
        "max_completion_tokens": _json,
        "temperature": _json,
        "top_p": _json,
        "top_k": _json,
        "stop": _json,
        "stream": st.booleans() | _json,
        "tools": _json,
        "system": _json,
        "stop_sequences": _json,
        "n": _json,
        "stream_options": _json,
    },
)


@pytest.mark.slow
def test_fuzzed_bodies_never_get_a_500(harness: Harness) -> None:
    h = harness
    h.sampler.default = h.reply("ok")
    sid = h.session(max_context_tokens=0)
    client = httpx.Client(timeout=10)
    paths = [h.server.base_url + "/chat/completions", h.server.root_url + "/v1/messages",
             h.server.root_url + "/v1/messages/count_tokens"]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=_body, path=st.sampled_from(paths), raw=st.booleans())
    def check(body: dict[str, Any], path: str, raw: bool) -> None:
        content = json.dumps(body).encode()
        if raw:
            content = content[: len(content) // 2]
        r = client.post(path, content=content, headers={"authorization": f"Bearer {sid}"})
        assert r.status_code < 500, (body, r.text)
        if r.status_code >= 400:
            payload = r.json()
            message = payload["error"]["message"]
            assert isinstance(message, str) and message

    try:
        check()
    finally:
        client.close()

"""The agent app's HTTP contract, driven in-process through httpx's ASGITransport.

The runtime tests (tests/runtime) serve the same app in real uvicorn processes;
here we check the protocol edge cases fast and deterministically.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.agent import (
    SESSION_HEADER,
    TOKEN_ENV,
    TOKEN_HEADER,
    AgentApp,
    AgentCoreRuntimeApp,
    ModelConfig,
    RequestContext,
)
from core.agent._auth import guard

ENV = "_agentcore_runtime"


def _op(operation: str, inv: str, **extra: Any) -> dict[str, Any]:
    return {ENV: {"version": 1, "operation": operation, "invocation_id": inv, **extra}}


def _run(app: AgentApp, body: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            await body(client)

    asyncio.run(main())


async def _post(client: httpx.AsyncClient, payload: Any, session: str = "s1") -> httpx.Response:
    return await client.post(
        "/invocations", content=json.dumps(payload), headers={SESSION_HEADER: session}
    )


def test_start_get_long_poll_and_idempotent_start(tmp_path: Path) -> None:
    app = AgentApp(workdir_root=tmp_path)
    calls: list[str] = []

    @app.entrypoint
    async def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        calls.append(context.session_id)
        await asyncio.sleep(0.2)
        cfg = ModelConfig.from_payload(payload)
        return {"reward": 1.0, "key": cfg.api_key, "dir": str(context.workdir)}

    async def body(client: httpx.AsyncClient) -> None:
        payload = {
            "q": 1,
            "_config": {"base_url": "http://gw/v1", "model_id": "m", "api_key": "sid-1"},
        }
        r = await _post(client, {**payload, **_op("start", "inv1", background=True)})
        assert r.status_code == 200 and r.json()["status"] == "in_progress"
        assert (await client.get("/ping")).json()["status"] == "HealthyBusy"
        again = await _post(client, {**payload, **_op("start", "inv1", background=True)})
        assert again.json()["status"] == "in_progress"
        r = await _post(client, _op("get", "inv1", wait_s=5))
        state = r.json()
        assert state["status"] == "completed"
        assert state["result"]["reward"] == 1.0 and state["result"]["key"] == "sid-1"
        assert Path(state["result"]["dir"]) == tmp_path / "s1"
        assert (await client.get("/ping")).json()["status"] == "Healthy"
        assert calls == ["s1"]  # the retried start did not run the handler twice
        other = await _post(client, _op("get", "inv1"), session="s2")
        assert other.json()["status"] == "not_found"  # ids are per session

    _run(app, body)


def test_finished_invocations_past_max_completed_go_first_finished_first() -> None:
    """``max_completed=2``: the third to finish evicts the first to finish, though it started
    last; one still running is never evicted, and a start of an evicted id runs again."""
    app = AgentApp(max_completed=2)
    release = {k: asyncio.Event() for k in ("a", "b", "c", "d", "e")}
    calls: list[str] = []

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload["k"])
        await release[payload["k"]].wait()
        return {"k": payload["k"]}

    async def status(client: httpx.AsyncClient, inv: str) -> str:
        return str((await _post(client, _op("get", inv))).json()["status"])

    async def body(client: httpx.AsyncClient) -> None:
        for k in ("a", "b", "c", "d", "e"):
            await _post(client, {"k": k, **_op("start", k, background=True)})
        for k in ("e", "b", "c"):  # finish order e, b, c: e is the oldest to have finished
            release[k].set()
            assert (await _post(client, _op("get", k, wait_s=5))).json()["status"] == "completed"
        assert [await status(client, k) for k in "abcde"] == [
            "in_progress", "completed", "completed", "in_progress", "not_found"
        ]
        release["e"].clear()
        await _post(client, {"k": "e", **_op("start", "e", background=True)})
        assert await status(client, "e") == "in_progress"
        for k in ("a", "d", "e"):
            release[k].set()
            assert (await _post(client, _op("get", k, wait_s=5))).json()["status"] == "completed"
        assert calls.count("e") == 2

    _run(app, body)


def test_handler_exception_becomes_failed_result_with_traceback() -> None:
    app = AgentApp()

    @app.entrypoint
    def handler(payload: dict[str, Any]) -> dict[str, Any]:
        raise ZeroDivisionError(f"bad input {payload['x']}")

    async def body(client: httpx.AsyncClient) -> None:
        await _post(client, {"x": 7, **_op("start", "a", background=True)})
        state = (await _post(client, _op("get", "a", wait_s=5))).json()
        assert state["status"] == "completed"
        assert "Traceback" in state["error"] and "ZeroDivisionError: bad input 7" in state["error"]
        assert "result" not in state

    _run(app, body)


def test_cancel_stops_a_hanging_handler() -> None:
    app = AgentApp()

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"reward": 1.0}

    async def body(client: httpx.AsyncClient) -> None:
        await _post(client, _op("start", "h", background=True))
        state = (await _post(client, _op("cancel", "h"))).json()
        assert state["status"] == "completed" and "cancelled" in state["error"]
        assert (await client.get("/ping")).json()["status"] == "Healthy"

    _run(app, body)


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (_op("start", "bad id!"), "invocation_id"),
        ({ENV: {"version": 2, "operation": "start", "invocation_id": "a"}}, "version"),
        (_op("get", "a", background=True), "background"),
        (_op("start", "a", extra=1), "unknown fields"),
        ({"_rollout": {"exp_id": "e", "s3_bucket": "b"}}, "input_id"),
        ({"_rollout": {"exp_id": "e", "s3_bucket": "b", "input_id": "g/../h"}}, "no '/'"),
    ],
)
def test_bad_envelopes_are_400_naming_the_field(payload: dict[str, Any], needle: str) -> None:
    app = AgentApp()
    app.entrypoint(lambda p: {"reward": 0.0})

    async def body(client: httpx.AsyncClient) -> None:
        r = await _post(client, payload)
        assert r.status_code == 400
        assert needle in r.json()["error"]

    _run(app, body)


def test_non_json_and_non_object_bodies_are_400() -> None:
    app = AgentApp()
    app.entrypoint(lambda p: {"reward": 0.0})

    async def body(client: httpx.AsyncClient) -> None:
        r = await client.post("/invocations", content=b"{nope")
        assert r.status_code == 400 and "not JSON" in r.json()["error"]
        r = await client.post("/invocations", content=b"[1, 2]")
        assert r.status_code == 400 and "JSON object" in r.json()["error"]

    _run(app, body)


def test_plain_request_background_vs_foreground() -> None:
    bg = AgentApp()
    bg.entrypoint(lambda p: {"reward": p["r"]})
    fg = AgentCoreRuntimeApp()  # the toolkit's default: no envelope means wait for the handler
    fg.entrypoint(lambda p: {"reward": p["r"]})

    async def body_bg(client: httpx.AsyncClient) -> None:
        state = (await _post(client, {"r": 0.25})).json()
        assert state["status"] == "in_progress"
        got = (await _post(client, _op("get", state["invocation_id"], wait_s=5))).json()
        assert got["result"] == {"reward": 0.25}

    async def body_fg(client: httpx.AsyncClient) -> None:
        assert (await _post(client, {"r": 0.75})).json() == {"reward": 0.75}

    _run(bg, body_bg)
    _run(fg, body_fg)


def test_rollout_shape_without_s3_answers_processing() -> None:
    app = AgentApp()
    seen: list[ModelConfig] = []

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        seen.append(ModelConfig.from_payload(payload))
        return {"rewards": [0.0, 1.0]}

    async def body(client: httpx.AsyncClient) -> None:
        payload = {
            "_rollout": {
                "base_url": "http://gw/v1",
                "model_id": "m",
                "sampling_params": {"temperature": 0.5},
            }
        }
        reply = (await _post(client, payload)).json()
        assert reply["status"] == "processing" and "result_key" not in reply
        got = (await _post(client, _op("get", reply["invocation_id"], wait_s=5))).json()
        assert got["result"] == {"rewards": [0.0, 1.0]}
        assert seen[0].sampling_params == {"temperature": 0.5} and seen[0].api_key == "EMPTY"

    _run(app, body)


def test_model_config_prefers_config_and_explains_missing_url() -> None:
    cfg = ModelConfig.from_payload(
        {
            "_rollout": {"base_url": "http://old/v1", "model_id": "a"},
            "_config": {"base_url": "http://gw/v1", "api_key": "sid"},
        }
    )
    assert (cfg.base_url, cfg.model_id, cfg.api_key) == ("http://gw/v1", "a", "sid")
    with pytest.raises(ValueError, match="no model base_url"):
        ModelConfig.from_payload({"prompt": "hi"})


def test_nan_reward_reaches_the_caller_instead_of_a_500() -> None:
    app = AgentApp()
    app.entrypoint(lambda p: {"reward": float("nan")})

    async def body(client: httpx.AsyncClient) -> None:
        await _post(client, _op("start", "n", background=True))
        r = await _post(client, _op("get", "n", wait_s=5))
        assert r.status_code == 200
        assert "NaN" in r.text and r.json()["status"] == "completed"

    _run(app, body)


def test_no_entrypoint_is_a_clear_500() -> None:
    async def body(client: httpx.AsyncClient) -> None:
        r = await _post(client, {"x": 1})
        assert r.status_code == 500 and "@app.entrypoint" in r.json()["error"]

    _run(AgentApp(), body)


def test_cli_rejects_a_bad_agent_spec() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "core.agent", "no_colon_here", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "module:attribute" in proc.stderr


def test_token_guard_refuses_invocations_without_the_token() -> None:
    """With a token, /invocations needs it (401 otherwise); /ping stays open for health checks."""
    app = AgentApp()
    seen: list[dict[str, str]] = []

    @app.entrypoint
    def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        seen.append(dict(context.request_headers))
        return {"reward": 1.0}

    async def main() -> None:
        transport = httpx.ASGITransport(app=guard(app, "s3cret"))
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            start = _op("start", "t", background=False)
            bare = await _post(client, start)
            assert bare.status_code == 401 and TOKEN_HEADER in bare.json()["error"]
            wrong = await client.post(
                "/invocations",
                content=json.dumps(start),
                headers={SESSION_HEADER: "s1", TOKEN_HEADER: "guess"},
            )
            assert wrong.status_code == 401
            assert seen == [], "the handler must not run for a refused request"
            assert (await client.get("/ping")).status_code == 200
            ok = await client.post(
                "/invocations",
                content=json.dumps(start),
                headers={SESSION_HEADER: "s1", TOKEN_HEADER: "s3cret"},
            )
            assert ok.status_code == 200 and ok.json()["result"] == {"reward": 1.0}
            assert seen and TOKEN_HEADER.lower() not in seen[0], "the handler never sees the token"

    asyncio.run(main())
    assert guard(app, "") is app  # no token: nothing in front of the app


def _listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port``, read from /proc/net/tcp."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
            found.append(".".join(str(b) for b in reversed(bytes.fromhex(host_hex))))
    return found


@pytest.mark.integration
def test_cli_binds_loopback_by_default_and_demands_the_env_token(tmp_path: Path) -> None:
    """A real ``python -m core.agent``: loopback unless told otherwise, 401 without the token."""
    (tmp_path / "tiny_agent.py").write_text(
        "from core.agent import AgentApp\n"
        "app = AgentApp(background=False)\n"
        "app.entrypoint(lambda payload: {'reward': 0.5})\n"
    )
    port_file = tmp_path / "port"
    env = {**os.environ, TOKEN_ENV: "tok-123", "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.agent", "tiny_agent:app", "--port", "0"]
        + ["--port-file", str(port_file)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        port = int(port_file.read_text())
        assert _listening_addresses(port) == ["127.0.0.1"]
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, trust_env=False) as client:
            while True:
                try:
                    assert client.get("/ping").status_code == 200
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the agent never answered /ping"
                    time.sleep(0.05)
            assert client.post("/invocations", json={"q": 1}).status_code == 401
            r = client.post("/invocations", json={"q": 1}, headers={TOKEN_HEADER: "tok-123"})
            assert r.status_code == 200 and r.json() == {"reward": 0.5}
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_ping_reports_an_exhausted_pool_of_abandoned_sync_handlers() -> None:
    """A cancelled sync handler keeps its thread: /ping counts it and, once all are taken
    and one by a cancelled invocation, 503s; a pool full of live work is only busy."""
    app = AgentApp(max_threads=1)
    release = threading.Event()
    ran: list[str] = []

    @app.entrypoint
    def handler(payload: dict[str, Any]) -> dict[str, Any]:
        ran.append(payload["tag"])
        release.wait(30)
        return {"reward": 1.0}

    async def body(client: httpx.AsyncClient) -> None:
        ping = (await client.get("/ping")).json()
        assert ping["status"] == "Healthy"
        assert ping["threads"] == {"max": 1, "busy": 0, "abandoned": 0, "queued": 0}
        await _post(client, {"tag": "stuck", **_op("start", "a", background=True)})
        while not ran:
            await asyncio.sleep(0.01)
        await _post(client, {"tag": "queued", **_op("start", "b", background=True)})
        while app.pool_state().queued == 0:  # its task reaches the pool on its first step
            await asyncio.sleep(0.01)
        r = await client.get("/ping")
        assert r.status_code == 200 and r.json()["status"] == "HealthyBusy"
        assert r.json()["threads"] == {"max": 1, "busy": 1, "abandoned": 0, "queued": 1}
        for inv in ("a", "b"):
            state = (await _post(client, _op("cancel", inv))).json()
            assert "cancelled" in state["error"]
        r = await client.get("/ping")
        assert r.status_code == 503 and "1 of them" in r.json()["reason"]
        assert r.json()["threads"] == {"max": 1, "busy": 1, "abandoned": 1, "queued": 0}
        release.set()
        for _ in range(200):
            r = await client.get("/ping")
            if r.status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert r.json()["status"] == "Healthy"
        assert r.json()["threads"] == {"max": 1, "busy": 0, "abandoned": 0, "queued": 0}
        assert ran == ["stuck"], "a call cancelled while queued must never run"

    try:
        _run(app, body)
    finally:
        release.set()


def test_app_run_binds_loopback_outside_containers_and_guards_with_the_env_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``app.run()``'s choices, read where it hands over to uvicorn (no server is started;
    whether we are in a container is stubbed, the one input this test cannot set)."""
    import uvicorn

    from core.agent._auth import TokenGuard

    served: list[tuple[Any, str]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: served.append((app, host)))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    app = AgentApp()
    # This suite itself may run in Docker: decide "container or not" per call.
    monkeypatch.setattr("core.agent._app._in_container", lambda: False)
    app.run()
    monkeypatch.setenv(TOKEN_ENV, "t0k")
    monkeypatch.setattr("core.agent._app._in_container", lambda: True)
    app.run()
    (plain, plain_host), (guarded, container_host) = served
    assert plain is app and plain_host == "127.0.0.1"
    assert isinstance(guarded, TokenGuard) and guarded.app is app and container_host == "0.0.0.0"

"""``python -m core.gateway`` serves on its own and its admin routes create and read sessions."""

from __future__ import annotations

import os
import sys

import httpx
import openai
import pytest

from core.gateway.__main__ import LOOP_ENV, _loop_factory
from tests.gateway_process import served_gateway


@pytest.mark.integration
@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_cli_serves_and_shows_traces(loop: str) -> None:
    """On uvloop when it is installed (``auto``), and on the standard library's loop."""
    args = ("--reply", "pong", "--sessions", "1", "--ignore-request-field", "x_client_tag")
    with served_gateway(*args, env={**os.environ, LOOP_ENV: loop}) as (proc, info):
        assert info["loop"] == ("uvloop" if loop == "auto" else "asyncio")  # uvloop: a dependency on Linux
        admin = {"authorization": f"Bearer {info['admin_token']}"}
        with openai.OpenAI(base_url=info["base_url"], api_key=info["sessions"][0], max_retries=0) as client:
            out = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "ping"}], extra_body={"x_client_tag": "a"}
            )
            with pytest.raises(openai.BadRequestError):  # not listed: refused
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "ping"}], extra_body={"x_other": "a"}
                )
        assert out.choices[0].message.content == "pong"
        with httpx.Client() as http:
            sid = http.post(info["root_url"] + "/admin/sessions", headers=admin, json={}).json()["session_id"]
            assert sid != info["sessions"][0]
            rows = http.get(f"{info['root_url']}/admin/sessions/{info['sessions'][0]}/trace", headers=admin).json()
        assert len(rows["rows"]) == 1 and sum(rows["rows"][0]["loss_mask"]) > 0
    assert proc.returncode is not None


def test_loop_factory_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop absent (or ``TRACERL_GATEWAY_LOOP=asyncio``): the standard loop; a bad value is refused."""
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert _loop_factory() is None
    monkeypatch.setenv(LOOP_ENV, "auto")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an uninstalled module imports as
    assert _loop_factory() is None
    monkeypatch.setenv(LOOP_ENV, "uv")
    with pytest.raises(SystemExit, match="TRACERL_GATEWAY_LOOP must be 'auto' or 'asyncio', got 'uv'"):
        _loop_factory()


def test_loop_factory_picks_uvloop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    monkeypatch.delenv(LOOP_ENV, raising=False)
    assert _loop_factory() is uvloop.new_event_loop

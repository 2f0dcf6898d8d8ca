"""``python -m core.gateway`` serves on its own and its admin routes create and read sessions."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest


@pytest.mark.integration
def test_cli_serves_and_shows_traces() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.gateway", "--reply", "pong", "--sessions", "1",
         "--ignore-request-field", "x_client_tag"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
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
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode is not None

"""A served gateway stays small: 256 sessions of about 1k tokens each, two turns each, in a
``python -m core.gateway`` process whose peak resident memory stays under 150 MB (issue #32's
bound) and which never loads torch, with the tiny tokenizer (it read 108 MB) and with Qwen3's
own tokenizer and template from the test fixtures (it read 143 MB, 2026-12-03: about 133 MB
before the first session, the sessions 10 MB). A memory bound, not a timing: it holds on a
loaded machine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.gateway_process import served_gateway
from tests.proc_memory import peak_mb

SESSIONS = 256
PEAK_MB = 150


def _tokenizer(name: str) -> str:
    if name == "tiny":
        return "tiny"
    from tests.gateway.families import FAMILIES, files

    return str(files(FAMILIES[name]))


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("tokenizer", ["tiny", "qwen3"])
def test_gateway_peak_rss_at_256_sessions_of_1k_tokens(tokenizer: str) -> None:
    root = Path(__file__).resolve().parents[2]
    args = ("--tokenizer", _tokenizer(tokenizer), "--reply", "fine, thanks", "--sessions", "0",
            "--max-context-tokens", "0", "--max-pending-headers-per-client", "0")
    with served_gateway(*args, cwd=root) as (proc, info):
        admin = {"authorization": f"Bearer {info['admin_token']}"}
        words = " ".join(f"word{i % 50}" for i in range(200))  # ~1k tokens with the first user turn

        async def run() -> None:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                sids = [(await client.post(info["root_url"] + "/admin/sessions", headers=admin, json={})).json()[
                    "session_id"] for _ in range(SESSIONS)]

                async def session(i: int, sid: str) -> None:
                    msgs = [{"role": "system", "content": f"agent {i}: {words}"},
                            {"role": "user", "content": words}]
                    for turn in range(2):
                        r = await client.post(info["base_url"] + "/chat/completions",
                                              json={"model": "m", "messages": msgs},
                                              headers={"authorization": f"Bearer {sid}"})
                        assert r.status_code == 200, r.text
                        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"{turn}: {words}"}]

                await asyncio.gather(*(session(i, sid) for i, sid in enumerate(sids)))
                prompt = (await client.get(f"{info['root_url']}/admin/sessions/{sids[0]}/trace",
                                           headers=admin)).json()["rows"][0]["prompt_length"]
                assert prompt > 500, prompt  # the sessions really hold about a thousand tokens

        asyncio.run(run())
        peak = peak_mb(proc.pid)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libtorch" not in maps, "the gateway process loaded torch"
        assert peak < PEAK_MB, f"gateway peak RSS {peak:.0f} MB at {SESSIONS} sessions, {tokenizer} (bound {PEAK_MB} MB)"

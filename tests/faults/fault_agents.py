"""Agents for the fault-injection tests, served by the local runtime in their own
processes (the tests put this folder on the agents' PYTHONPATH and point
``FAULT_DIR`` at the test's temporary folder).

Each makes one succ_digit model call through the gateway, with one way of going
wrong. Rewards are 1.0 for an odd reply and 0.0 otherwise (the fake policy answers a
random digit): with the real task's reward (right 1 time in 10) most groups of two
would be constant and no step would train, leaving nothing to check.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from core.agent import AgentApp
from core.http import FastClient
from core.tasks.succ_digit import SYSTEM, question


def _fault_dir() -> Path:
    return Path(os.environ["FAULT_DIR"])


def _body(payload: dict[str, Any]) -> dict[str, Any]:
    config = payload["_config"]
    return {
        "model": config["model_id"],
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question(int(payload["n"]))},
        ],
        **(config.get("sampling_params") or {}),
    }


def _odd(reply: str) -> float:
    return float(sum(map(ord, reply.strip())) % 2)


_client: FastClient | None = None


async def _ask(payload: dict[str, Any], follow_up: str = "") -> tuple[int, str]:
    """One chat completion through the gateway: ``(HTTP status, reply text)``; with
    ``follow_up``, the conversation goes on: the reply, then that user message."""
    global _client
    if _client is None:
        _client = FastClient(max_connections=64, timeout=60.0)
    config = payload["_config"]
    body = _body(payload)
    if follow_up:
        body["messages"] += [{"role": "assistant", "content": follow_up}, {"role": "user", "content": "And?"}]
    response = await _client.post(
        f"{config['base_url'].rstrip('/')}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {config['api_key']}"},
    )
    if response.status_code != 200:
        return response.status_code, response.text
    return 200, response.json()["choices"][0]["message"]["content"] or ""


async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    status, reply = await _ask(payload)
    if status != 200:
        raise RuntimeError(f"gateway answered HTTP {status}: {reply[:500]}")
    return {"reward": _odd(reply)}


succ = AgentApp()


@succ.entrypoint
async def succ_solve(payload: dict[str, Any]) -> dict[str, Any]:
    """The plain succ_digit agent; it first leaves its pid under its session key, so a
    test can kill the process that serves a given gateway session."""
    key = payload["_config"]["api_key"]
    (_fault_dir() / f"{key}.pid").write_text(str(os.getpid()))
    return await solve(payload)


two_turns = AgentApp()


@two_turns.entrypoint
async def two_turn_solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Two model calls (the second continues the first), pid left under the session key."""
    key = payload["_config"]["api_key"]
    (_fault_dir() / f"{key}.pid").write_text(str(os.getpid()))
    status, reply = await _ask(payload)
    if status == 200:
        status, reply = await _ask(payload, follow_up=reply)
    if status != 200:
        raise RuntimeError(f"gateway answered HTTP {status}: {reply[:500]}")
    return {"reward": _odd(reply)}


bad_rewards = AgentApp()
_seen: Counter[str] = Counter()

BAD = {
    "nan": math.nan,
    "int400": 10**400,  # a 401-digit integer in the JSON result
    "1e200": 1e200,
    "string": "0.5",
}


@bad_rewards.entrypoint
async def bad_reward(payload: dict[str, Any]) -> dict[str, Any]:
    """succ_digit, except that the first rollout of a row marked ``bad`` returns that bad
    reward (its group mates return real ones). One process serves every rollout, so the
    counter sees them all."""
    result = await solve(payload)
    kind = payload.get("bad")
    if kind:
        _seen[kind] += 1
        if _seen[kind] == 1:
            result["reward"] = BAD[kind]
    return result


sync_hang = AgentApp()


def _claim(name: str) -> bool:
    """True for exactly one caller across processes (the file is created once)."""
    try:
        fd = os.open(_fault_dir() / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


@sync_hang.entrypoint
def sync_solve(payload: dict[str, Any]) -> dict[str, Any]:
    """A sync handler (runs on the agent's thread pool): the model call, then the first
    rollout ever hangs for good in a blocking call, which no cancel can interrupt."""
    config = payload["_config"]
    request = urllib.request.Request(
        f"{config['base_url'].rstrip('/')}/chat/completions",
        data=json.dumps(_body(payload)).encode(),
        headers={"Authorization": f"Bearer {config['api_key']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        reply = json.loads(response.read())["choices"][0]["message"]["content"] or ""
    if _claim("hang.claimed"):
        time.sleep(3600)
    return {"reward": _odd(reply), "metrics": {"pid": os.getpid()}}


swallowing = AgentApp()


@swallowing.entrypoint
async def swallow_sampler_errors(payload: dict[str, Any]) -> dict[str, Any]:
    """A failed model call (the gateway's 503) is swallowed and scored 0.0, as a careless
    agent would."""
    status, reply = await _ask(payload)
    return {"reward": _odd(reply) if status == 200 else 0.0}

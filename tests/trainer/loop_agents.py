"""Agents for the loop tests, served by the local runtime in their own processes
(the tests put this directory on the agents' PYTHONPATH)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from core.agent import AgentApp
from core.tasks.succ_digit import solve

flaky = AgentApp()


@flaky.entrypoint
async def flaky_solve(payload: dict[str, Any]) -> dict[str, Any]:
    """The succ_digit agent, except that rows marked ``fail`` crash."""
    if payload.get("fail"):
        raise RuntimeError(f"agent crashed on purpose for n={payload['n']}")
    return await solve(payload)


silent = AgentApp()


@silent.entrypoint
async def no_model_call(payload: dict[str, Any]) -> dict[str, Any]:
    """Returns a reward without ever calling the gateway (a miswired agent)."""
    return {"reward": 1.0}


crashing = AgentApp()


@crashing.entrypoint
async def always_crash(payload: dict[str, Any]) -> dict[str, Any]:
    raise ConnectionError("cannot reach http://localhost:9999/v1: connection refused")


constant = AgentApp()


@constant.entrypoint
async def constant_reward(payload: dict[str, Any]) -> dict[str, Any]:
    """Calls the model like succ_digit, then scores every answer 1.0 (no learning signal)."""
    await solve(payload)
    return {"reward": 1.0}


swallowing = AgentApp()


@swallowing.entrypoint
async def swallow_gateway_errors(payload: dict[str, Any]) -> dict[str, Any]:
    """succ_digit, except that a failed model call (the gateway's 503) is swallowed and
    scored 0.0, as a careless agent would."""
    try:
        return await solve(payload)
    except RuntimeError:
        return {"reward": 0.0}


huge = AgentApp()


@huge.entrypoint
async def huge_rewards(payload: dict[str, Any]) -> dict[str, Any]:
    """succ_digit, except that rows marked ``huge`` return an enormous reward."""
    result = await solve(payload)
    if payload.get("huge") == "float":
        result["reward"] = 1e200
    elif payload.get("huge") == "int":
        result["reward"] = 10**400
    return result


long_tail = AgentApp()


@long_tail.entrypoint
async def long_tail_solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Calls the model like succ_digit, then takes ``payload['delay_s']`` seconds (a slow
    tool or environment), or waits for the file ``payload['wait_for']``, and returns a
    random reward, so every group has a signal and every step moves the weight version."""
    await solve(payload)
    await asyncio.sleep(float(payload.get("delay_s", 0.0)))
    if payload.get("wait_for"):  # held until the test creates this file (at most 60 s)
        deadline = time.monotonic() + 60
        while not Path(payload["wait_for"]).exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    return {"reward": random.random()}


overriding = AgentApp()


@overriding.entrypoint
async def override_temperature(payload: dict[str, Any]) -> dict[str, Any]:
    """succ_digit, except that rows with an odd ``n`` ask the gateway for temperature 0.5
    (a sampling override, which a session allowing overrides applies)."""
    if int(payload["n"]) % 2:
        config = dict(payload["_config"])
        config["sampling_params"] = {**(config.get("sampling_params") or {}), "temperature": 0.5}
        payload = {**payload, "_config": config}
    return await solve(payload)


tooled = AgentApp()


@tooled.entrypoint
async def offer_a_tool(payload: dict[str, Any]) -> dict[str, Any]:
    """succ_digit with a tool offered in every request; the fake model answers a digit, so no
    turn ever calls it (the loop's "tools offered, none called" warning)."""
    from core.tasks.succ_digit import _http, charwise_reward, question

    config = payload["_config"]
    tool = {"type": "function", "function": {"name": "next_digit", "parameters": {"type": "object", "properties": {}}}}
    body = {
        "model": config["model_id"],
        "messages": [{"role": "user", "content": question(int(payload["n"]))}],
        "tools": [tool],
        **(config.get("sampling_params") or {}),
    }
    response = await _http().post(
        f"{config['base_url'].rstrip('/')}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {config['api_key']}"},
    )
    if response.status_code != 200:
        raise RuntimeError(f"gateway answered HTTP {response.status_code}: {response.text[:500]}")
    reply = response.json()["choices"][0]["message"]["content"] or ""
    return {"reward": charwise_reward(reply, str(payload["answer"]))}


two_roles_parity = AgentApp()


@two_roles_parity.entrypoint
async def two_roles_by_parity(payload: dict[str, Any]) -> dict[str, Any]:
    """The two-role task's calls (``model`` up, then down), each reply scored by the parity
    of its first character: a random model's replies vary, so every group has a signal."""
    from core.tasks.two_roles import ROLES, _ask

    roles = {}
    for role in ROLES:
        reply = await _ask(payload["_config"], role, int(payload["n"]))
        roles[role] = float(ord(reply[0]) % 2) if reply else 0.0
    return {"reward": sum(roles.values()) / len(roles), "role_rewards": roles}


two_roles_up_only = AgentApp()


@two_roles_up_only.entrypoint
async def two_roles_only_up_scored(payload: dict[str, Any]) -> dict[str, Any]:
    """``two_roles_by_parity``, except that role ``down`` always scores 1.0: its role baseline
    leaves its turns no advantage, so policy ``down`` never steps while ``up`` does."""
    from core.tasks.two_roles import ROLES, _ask

    roles = {}
    for role in ROLES:
        reply = await _ask(payload["_config"], role, int(payload["n"]))
        roles[role] = 1.0 if role == "down" else (float(ord(reply[0]) % 2) if reply else 0.0)
    return {"reward": sum(roles.values()) / len(roles), "role_rewards": roles}


two_roles_random = AgentApp()


@two_roles_random.entrypoint
async def two_roles_random_rewards(payload: dict[str, Any]) -> dict[str, Any]:
    """The two-role relay's calls (one conversation, each turn naming its role as ``model``),
    with a random reward per role: a random model scores 0 on the task itself, and a random
    reward gives every group a signal, so every step trains and syncs each policy."""
    from core.tasks.two_roles import TURNS, _chat, first_role, play

    config = payload["_config"]

    async def ask(role: str, messages: list[dict[str, str]]) -> str:
        return await _chat(config, role, messages)

    result = await play(ask, int(payload["n"]), int(payload.get("turns", TURNS)), first_role(payload))
    roles = {role: random.random() for role in result["role_rewards"]}
    return {"reward": sum(roles.values()) / len(roles), "role_rewards": roles}

"""Agents served behind the AgentCore stand-in in the agentcore runtime tests.

``app`` is a tracerl ``AgentApp`` (speaks both result channels); ``art_rl_app``
and ``art_runtime_app`` are written for agentcore-rl-toolkit 0.2.0 exactly as its
users write them, importing the real toolkit classes. When the payload asks
(``call_model``), the agent makes one chat call to the gateway with the real
``openai`` SDK, the key being the session id it was given.
"""

from __future__ import annotations

import asyncio
import os

from agentcore_rl_toolkit import AgentCoreRLApp
from agentcore_rl_toolkit.runtime import AgentCoreRuntimeApp

from core.agent import AgentApp, ModelConfig, RequestContext

app = AgentApp()


async def _call_model(cfg: ModelConfig, prompt: str) -> str:
    import openai

    client = openai.AsyncOpenAI(base_url=cfg.base_url, api_key=cfg.api_key, max_retries=0)
    reply = await client.chat.completions.create(
        model=cfg.model_id,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=int(cfg.sampling_params.get("max_tokens", 8)),
    )
    await client.close()
    return reply.choices[0].message.content or ""


@app.entrypoint
async def handler(payload: dict, context: RequestContext) -> dict:
    mode = payload.get("mode", "ok")
    if mode == "hang":
        (context.workdir / "pid").write_text(str(os.getpid()))
        await asyncio.sleep(3600)
    if mode == "raise":
        raise RuntimeError(f"agent bug on purpose: {payload.get('tag')}")
    cfg = ModelConfig.from_payload(payload)
    await asyncio.sleep(float(payload.get("sleep_s", 0.0)))
    text = await _call_model(cfg, str(payload.get("prompt", "hi"))) if payload.get("call_model") else ""
    return {
        "reward": float(payload.get("reward", 1.0)),
        "metrics": {
            "key_is_session": float(cfg.api_key == payload.get("expect_key")),
            "base_url_ok": float(cfg.base_url == payload.get("expect_base_url")),
            "pid": float(os.getpid()),
            "reply_chars": float(len(text)),
        },
    }


art_rl_app = AgentCoreRLApp()


@art_rl_app.rollout_entrypoint
async def art_rl_handler(payload, context):
    rollout = payload["_rollout"]
    return {
        "rewards": [0.0, float(payload["reward"])],
        "metrics": {"key_is_session": float(rollout.get("api_key") == payload.get("expect_key"))},
    }


art_runtime_app = AgentCoreRuntimeApp(background=True)


@art_runtime_app.entrypoint
async def art_runtime_handler(payload, context):
    config = payload["_config"]
    await asyncio.sleep(float(payload.get("sleep_s", 0.0)))
    return {
        "reward": float(payload["reward"]),
        "metrics": {"key_is_session": float(config["api_key"] == payload.get("expect_key"))},
    }

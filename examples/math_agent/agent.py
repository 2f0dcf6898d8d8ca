"""The math agent: answers a GSM8K-style question with a calculator tool, scores itself.

Production code and training code are the same file: the agent calls whatever
OpenAI-compatible endpoint the payload names (the tracerl gateway while
training). Serve it with ``python -m core.agent examples.math_agent.agent:app``.

Payload: ``{"prompt": str, "answer": str|number, "_config": {base_url, model_id,
api_key, sampling_params}}``. Returns ``{"reward", "metrics", "response"}``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from core.agent import AgentApp, ModelConfig, RequestContext
from examples.math_agent.calculator import CALCULATOR_TOOL, calculate
from examples.math_agent.client import gateway_client
from examples.math_agent.reward import gsm8k_reward

SYSTEM_PROMPT = (
    "Your task is to solve the math problem. "
    "Use the calculator tool to compute all mathematical expressions. "
    'Let\'s think step by step and output the final answer after "####".'
)
MAX_TURNS = 8
FORWARDED = ("temperature", "top_p", "max_tokens")

app = AgentApp()


@app.entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """Run the tool loop until the model answers without a tool call (or MAX_TURNS)."""
    prompt = payload.get("prompt")
    if not isinstance(prompt, str):  # validate: never hand raw payload structures to the model
        raise ValueError(f"payload 'prompt' must be a string, got {type(prompt).__name__}")
    cfg = ModelConfig.from_payload(payload)
    sampling = {k: v for k, v in cfg.sampling_params.items() if k in FORWARDED}
    client = gateway_client(cfg)  # shared connection pool, this session's api key
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    tool_calls = tool_errors = turns = 0
    final = ""
    try:
        for _ in range(MAX_TURNS):
            turns += 1
            completion = await client.chat.completions.create(
                model=cfg.model_id, messages=messages, tools=[CALCULATOR_TOOL], **sampling
            )
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                final = message.content or ""
                break
            for call in message.tool_calls:
                tool_calls += 1
                try:
                    expression = json.loads(call.function.arguments)["expression"]
                    output = calculate(str(expression))
                except (ValueError, KeyError, TypeError) as exc:
                    output = f"error: bad arguments ({exc})"
                tool_errors += output.startswith("error:")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    finally:
        if os.environ.get("MATH_AGENT_SAVE_TRANSCRIPT"):
            # The session's own directory: sessions share the process, not the folder.
            (context.workdir / "transcript.json").write_text(json.dumps(messages))
    reward = gsm8k_reward(final, payload.get("answer", ""))
    return {
        "reward": reward,
        "metrics": {"turns": turns, "tool_calls": tool_calls, "tool_errors": tool_errors},
        "response": final,
    }


if __name__ == "__main__":
    app.run()

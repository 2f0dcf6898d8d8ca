"""The math agent on Strands Agents: a real framework client of the gateway.

Same task as ``examples/math_agent`` (GSM8K-style question, calculator tool,
final answer after ``####``, reward 1.0 on the right number), but the tool loop
is Strands' own: ``Agent`` + ``OpenAIModel`` (streaming chat completions, the
default) + a ``@tool``-decorated calculator. Nothing here knows about training;
the only tracerl-specific lines are the decorator and the model config read
from the payload. Serve it with
``python -m core.agent examples.strands_math_agent.agent:app``.

Defines ``app``, ``calculator`` (the Strands tool), ``SYSTEM_PROMPT``,
``build_agent`` and ``openai_transcript``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from strands import Agent, tool
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

from core.agent import AgentApp, ModelConfig, RequestContext
from examples.math_agent.calculator import calculate
from examples.math_agent.client import gateway_client
from examples.math_agent.reward import gsm8k_reward

SYSTEM_PROMPT = (
    "Your task is to solve the math problem. "
    "Use the calculator tool to compute all mathematical expressions. "
    'Let\'s think step by step and output the final answer after "####".'
)
FORWARDED = ("temperature", "top_p", "max_tokens")

app = AgentApp()


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. '12 * (3 + 4)'.

    Args:
        expression: The expression.
    """
    return calculate(expression)


def build_agent(cfg: ModelConfig) -> Agent:
    """A fresh Strands agent pointed at ``cfg``'s endpoint (one per session: not shareable).

    The session id goes in the api-key slot, as for any OpenAI-compatible
    endpoint. The client is injected: with ``client_args`` Strands builds a new
    ``AsyncOpenAI`` (httpx pool, TLS context) for every model call;
    ``gateway_client`` shares one pool per process (examples/math_agent/client.py).
    """
    model = OpenAIModel(
        client=gateway_client(cfg),
        model_id=cfg.model_id,
        params={k: v for k, v in cfg.sampling_params.items() if k in FORWARDED},
    )
    return Agent(
        model=model,
        tools=[calculator],
        system_prompt=SYSTEM_PROMPT,
        callback_handler=None,  # no printing: one process serves many sessions
    )


def openai_transcript(agent: Agent) -> dict[str, Any]:
    """The conversation in the OpenAI shape Strands sends it in, plus the tool schemas.

    Uses Strands' own formatter, so the saved transcript is what went over the
    wire (the end-to-end test renders it with the chat template and compares it
    with the gateway's trace).
    """
    messages = OpenAIModel.format_request_messages(agent.messages, SYSTEM_PROMPT)
    tools = [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec["description"],
                "parameters": spec["inputSchema"]["json"],
            },
        }
        for spec in agent.tool_registry.get_all_tool_specs()
    ]
    return {"messages": messages, "tools": tools}


def _final_text(agent: Agent) -> str:
    """Text of the last assistant message (empty when it has none)."""
    for message in reversed(agent.messages):
        if message["role"] == "assistant":
            return "".join(block.get("text", "") for block in message["content"])
    return ""


@app.entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """Let Strands run the tool loop, then score the answer after ``####``."""
    prompt = payload.get("prompt")
    if not isinstance(prompt, str):  # validate: never hand raw payload structures to the model
        raise ValueError(f"payload 'prompt' must be a string, got {type(prompt).__name__}")
    agent = build_agent(ModelConfig.from_payload(payload))
    truncated = 0
    try:
        await agent.invoke_async(prompt)
    except MaxTokensReachedException:
        # A reply cut at max_tokens is a wrong answer to learn from, not a crash
        # (a crash would leave the rollout out of its group); the partial reply
        # is already in agent.messages and is scored like any other.
        truncated = 1
    finally:
        if os.environ.get("MATH_AGENT_SAVE_TRANSCRIPT"):
            # The session's own directory: sessions share the process, not the folder.
            path = context.workdir / "transcript.json"
            path.write_text(json.dumps(openai_transcript(agent)))
    blocks = [b for m in agent.messages for b in m["content"]]
    tool_calls = sum("toolUse" in b for b in blocks)
    tool_errors = sum(b["toolResult"].get("status") == "error" for b in blocks if "toolResult" in b)
    final = _final_text(agent)
    return {
        "reward": gsm8k_reward(final, payload.get("answer", "")),
        "metrics": {
            "turns": sum(m["role"] == "assistant" for m in agent.messages),
            "tool_calls": tool_calls,
            "tool_errors": tool_errors,
            "truncated": truncated,
        },
        "response": final,
    }


if __name__ == "__main__":
    app.run()

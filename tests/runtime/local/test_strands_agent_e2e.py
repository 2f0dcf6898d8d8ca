"""End to end: the Strands math agent (``examples/strands_math_agent``) under the
local runtime, talking to the real gateway through Strands' ``OpenAIModel``
(streaming chat completions, Strands' own tool loop and message formatting).

Only the model is scripted (``ScriptedSampler``): a real model's output cannot
be scripted; the agent framework, the openai SDK under it, the agent processes,
the runtime and the gateway are the real ones.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from local_runtime_helpers import make_request

from core.gateway import Gateway, GatewayConfig, GatewayServer
from core.runtime.local import LocalRuntime
from core.samplers import ScriptedSampler, encode_reply
from core.types import RolloutStatus, SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N = 8


def _call(expression: str) -> str:
    args = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{args}\n</tool_call>"


def _flatten(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strands sends content as text parts; the chat template takes strings."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": "".join(p["text"] for p in content)}
        out.append(message)
    return out


def test_strands_agent_concurrent_rollouts_rewards_and_traces(
    byte_tokenizer: Any, tmp_path: Path
) -> None:
    tok = byte_tokenizer

    async def main() -> None:
        sampler = ScriptedSampler(tokenizer=tok)
        gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(), model_id="tiny")
        server = GatewayServer(gw, host="127.0.0.1", port=0)
        await server.start()
        rt = LocalRuntime(
            "examples.strands_math_agent.agent:app",
            env={"MATH_AGENT_SAVE_TRANSCRIPT": "1"},
            num_processes=2,
            workdir=str(tmp_path),
            keep_workdirs=True,
        )
        try:
            await rt.start()
            cases = []
            for i in range(N):
                a, b = 3 + i, 7
                right = i % 3 != 0  # every third rollout answers wrong: rewards must differ
                # Odd rollouts say something before calling the tool (text + tool call in one turn).
                lead = "Let me compute that.\n" if i % 2 else ""
                final = f"{a} * {b} = {a * b}.\n#### {a * b if right else a * b + 1}"
                replies = [
                    encode_reply(tok, lead + _call(f"{a} * {b}")),
                    encode_reply(tok, final),
                ]
                sid = gw.create_session(
                    sampling=SamplingParams(max_tokens=128),
                    metadata={"rollout_id": f"r{i}", "group_id": f"g{i // 4}"},
                )
                sampler.push(*replies, session_id=sid)
                req = make_request(
                    {"prompt": f"What is {a} times {b}?", "answer": str(a * b)},
                    base_url=server.base_url,
                    session_id=sid,
                    model_id="tiny",
                    sampling_params={"temperature": 1.0, "max_tokens": 128},
                    timeout_s=90,
                )
                cases.append((req, replies, right, i, a * b, lead))
            results = await asyncio.gather(*(rt.run_rollout(c[0]) for c in cases))
            assert len(results) == N
            for (req, replies, right, i, product, lead), res in zip(cases, results, strict=True):
                assert res.status is RolloutStatus.OK, res.error
                assert res.reward == (1.0 if right else 0.0)
                assert res.metrics == {
                    "turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0, "truncated": 0.0
                }
                rows = gw.finish_session(req.session_id)
                assert len(rows) == 1, "an append-only agent yields one row per session"
                row = rows[0]
                row.validate()
                saved = json.loads(
                    (tmp_path / "sessions" / req.session_id / "transcript.json").read_text()
                )
                transcript = _flatten(saved["messages"])
                assert [m["role"] for m in transcript] == [
                    "system",
                    "user",
                    "assistant",
                    "tool",
                    "assistant",
                ]
                assert transcript[2]["tool_calls"][0]["function"]["name"] == "calculator"
                assert transcript[2].get("content", "") == lead.strip(), transcript[2]
                assert transcript[3]["content"] == str(product)  # Strands really ran the tool
                text = tok.apply_chat_template(
                    transcript, tools=saved["tools"], tokenize=False, add_generation_prompt=False
                )
                full = list(tok.encode(text, add_special_tokens=False))
                # The row is the conversation the agent had, token for token, up to the
                # model's last end-of-turn (the template's trailing newline was never generated).
                assert row.token_ids == full[: len(row.token_ids)]
                assert tok.decode(full[len(row.token_ids) :]) == "\n"
                # The mask is 1 exactly on the generated tokens: the two scripted replies.
                generated = [t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m]
                assert generated == replies[0] + replies[1]
                assert [row.token_ids[t.start : t.end] for t in row.turns] == replies
                assert all(
                    row.loss_mask[t.start : t.end] == [1] * (t.end - t.start) for t in row.turns
                )
                assert (row.rollout_id, row.group_id) == (f"r{i}", f"g{i // 4}")
            assert len(sampler.calls) == 2 * N  # one model call per turn, no retries
        finally:
            await rt.aclose()
            await server.stop()

    asyncio.run(main())

"""End to end: the example math agent (official openai SDK) under the local runtime,
talking to the real gateway. Only the model is scripted (``ScriptedSampler``):
a real model's output cannot be scripted, everything else is the real stack.
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
from examples.math_agent.calculator import CALCULATOR_TOOL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N = 32


def _call(a: int, b: int) -> str:
    args = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
    return f"<tool_call>\n{args}\n</tool_call>"


def test_math_agent_32_concurrent_rollouts_rewards_and_traces(
    byte_tokenizer: Any, tmp_path: Path
) -> None:
    tok = byte_tokenizer

    async def main() -> None:
        sampler = ScriptedSampler(tokenizer=tok)
        gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(), model_id="tiny")
        server = GatewayServer(gw, host="127.0.0.1", port=0)
        await server.start()
        rt = LocalRuntime(
            "examples.math_agent.agent:app",
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
                final = f"{a} * {b} = {a * b}.\n#### {a * b if right else a * b + 1}"
                replies = [encode_reply(tok, _call(a, b)), encode_reply(tok, final)]
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
                    timeout_s=60,
                )
                cases.append((req, replies, right, i))
            results = await asyncio.gather(*(rt.run_rollout(c[0]) for c in cases))
            assert len(results) == N
            for (req, replies, right, i), res in zip(cases, results, strict=True):
                assert res.status is RolloutStatus.OK, res.error
                assert res.reward == (1.0 if right else 0.0)
                assert res.metrics == {"turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0}
                rows = gw.finish_session(req.session_id)
                assert len(rows) == 1, "an append-only agent yields one row per session"
                row = rows[0]
                row.validate()
                transcript = json.loads(
                    (tmp_path / "sessions" / req.session_id / "transcript.json").read_text()
                )
                assert [m["role"] for m in transcript] == [
                    "system",
                    "user",
                    "assistant",
                    "tool",
                    "assistant",
                ]
                a = int(req.payload["prompt"].split()[2])
                assert transcript[3]["content"] == str(a * 7)  # the calculator really ran
                text = tok.apply_chat_template(
                    transcript, tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=False
                )
                full = list(tok.encode(text, add_special_tokens=False))
                # The row is the conversation the agent had, token for token, up to the
                # model's last end-of-turn (the template's trailing newline was never generated).
                assert row.token_ids == full[: len(row.token_ids)]
                assert tok.decode(full[len(row.token_ids) :]) == "\n"
                assert [row.token_ids[t.start : t.end] for t in row.turns] == replies
                assert (row.rollout_id, row.group_id) == (f"r{i}", f"g{i // 4}")
            pids = {p.pid for p in rt.processes}
            assert len(pids) == 2
        finally:
            await rt.aclose()
            await server.stop()

    asyncio.run(main())

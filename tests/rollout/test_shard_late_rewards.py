"""Late rewards with ``gateway.shards`` (``reward_pending`` rollouts, ``core.gateway.late_rewards``).

The rollouts wait in the trainer's book (its in-process gateway's ``late_rewards``, which
``start_rollout_stack`` gives the shards); a reward posted there in the trainer's process
reaches a sharded rollout, and a shard refuses a posted reward, naming where it must go,
instead of losing it. Real ``python -m core.gateway shard`` processes; the agent runs in
this process with the official openai SDK; the model is scripted (the only thing faked).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from omegaconf import OmegaConf

from core.gateway import Gateway, GatewayConfig
from core.rollout import RolloutLimits, RolloutRunner
from core.rollout import stack as rollout_stack
from core.rollout.shards import GatewayShards, shard_spec
from core.samplers import ScriptedSampler
from core.types import RolloutRequest, RolloutResult, RolloutStatus, SamplingParams

REPLY = "The answer is 84."


def _gateway(tok: Any) -> Gateway:
    return Gateway(tokenizer=tok, sampler=ScriptedSampler(tokenizer=tok), config=GatewayConfig(), model_id="tiny")


class _SdkRuntime:
    """Runs each rollout as ``agent`` in this process (an agent process, without the spawn)."""

    def __init__(self, agent: Callable[[RolloutRequest], Awaitable[RolloutResult]]) -> None:
        self.agent = agent

    async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
        return await self.agent(request)

    async def cancel(self, rollout_id: str) -> None:
        return None


def test_a_late_reward_reaches_a_sharded_rollout_and_a_shard_refuses_one_posted_to_it(
    byte_tokenizer: Any, tmp_path: Path
) -> None:
    async def go() -> None:
        trainer_gw = _gateway(byte_tokenizer)
        shards = await GatewayShards.start(shard_spec(trainer_gw, {"kind": "scripted", "reply": REPLY}, tmp_path), 2)
        shards.late_rewards = trainer_gw.late_rewards  # what start_rollout_stack does (tested below)
        answers: dict[str, httpx.Response] = {}
        pending: asyncio.Queue[str] = asyncio.Queue()

        async def agent(request: RolloutRequest) -> RolloutResult:
            async with openai.AsyncOpenAI(base_url=request.base_url, api_key=request.session_id, max_retries=0) as c:
                out = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "12 * 7?"}])
                assert out.choices[0].message.content == REPLY
            # An agent posting its own reward to its gateway (a shard): refused, saying where.
            root = request.base_url.removesuffix("/v1")
            async with httpx.AsyncClient() as client:
                answers[request.rollout_id] = await client.post(
                    f"{root}/admin/rollouts/{request.rollout_id}/reward",
                    json={"reward": 0.5}, headers={"authorization": f"Bearer {trainer_gw.admin_token}"},
                )
            await pending.put(request.rollout_id)
            return RolloutResult(request.rollout_id, RolloutStatus.REWARD_PENDING)

        runner = RolloutRunner(
            gateway=None, base_url="", runtime=_SdkRuntime(agent), model_id="tiny", sessions=shards,
            limits=RolloutLimits(max_concurrency=4, timeout_s=60.0, reward_timeout_s=20.0),
        )
        try:
            rated = asyncio.create_task(runner.run_one({}, group_id="g", sampling=SamplingParams(max_tokens=32)))
            rid = await asyncio.wait_for(pending.get(), 60)
            await asyncio.sleep(0.2)  # the runner harvests the session, then waits for the reward
            trainer_gw.late_rewards.post(rid, 0.75)  # a rater in the trainer's process
            outcome = await asyncio.wait_for(rated, 60)
            assert outcome.result.status is RolloutStatus.OK and outcome.result.reward == 0.75, outcome.result.error
            assert len(outcome.rows) == 1 and outcome.rows[0].reward == 0.75 and outcome.rows[0].num_generated > 0

            refused = answers[rid]
            assert refused.status_code == 404
            assert "this gateway is a shard (gateway.shards)" in refused.text
            assert "Post it in the trainer's process" in refused.text and "gateway.shards=1" in refused.text

            # Nobody posts: reward_timeout, saying how a reward could have been posted.
            runner.reward_timeout_s = 0.3
            unrated = await runner.run_one({}, group_id="g2", sampling=SamplingParams(max_tokens=32))
            assert unrated.result.status is RolloutStatus.REWARD_TIMEOUT
            assert "LateRewards.post in the trainer's process" in (unrated.result.error or "")
        finally:
            await shards.aclose()

    asyncio.run(go())


def test_the_stack_gives_shards_the_trainers_late_reward_book(
    byte_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start_rollout_stack``'s shard start (``gateway.shards=2`` with an sglang fleet) hands
    the shards the in-process gateway's book; the shard processes themselves are replaced by
    a stand-in (their start is tested above and in test_shards.py)."""
    started: list[Any] = []

    async def fake_start(spec: Any, count: int, **kwargs: Any) -> Any:
        started.append((spec, count))
        return GatewayShards([], str(spec.gateway["admin_token"]), "")

    monkeypatch.setattr(GatewayShards, "start", fake_start)
    gw = _gateway(byte_tokenizer)
    cfg = OmegaConf.create({
        "gateway": {"shards": 2, "host": "127.0.0.1", "port": 0},
        "sampler": {"kind": "sglang", "urls": ["http://127.0.0.1:30000"]},
    })
    server, shards = asyncio.run(rollout_stack._serve(cfg, gw, ""))  # type: ignore[arg-type]
    assert server is None and shards is not None and started[0][1] == 2
    assert shards.late_rewards is gw.late_rewards

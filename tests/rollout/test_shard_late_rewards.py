"""Late rewards with ``gateway.shards`` (``reward_pending`` rollouts, ``core.gateway.late_rewards``).

The rollouts wait in the trainer's book (its in-process gateway's ``late_rewards``, which
``start_rollout_stack`` gives the shards). A reward posted over HTTP to the shard the agent
called reaches its rollout (the trainer collects it), as does one posted in the trainer's
process; a shard refuses a reward for a rollout it never served, naming where it must go,
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


def test_late_rewards_posted_to_a_shard_or_in_the_trainer_reach_sharded_rollouts(
    byte_tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def go() -> None:
        trainer_gw = _gateway(byte_tokenizer)
        shards = await GatewayShards.start(shard_spec(trainer_gw, {"kind": "scripted", "reply": REPLY}, tmp_path), 2)
        shards.collect_late_rewards(trainer_gw.late_rewards)  # what start_rollout_stack does (tested below)
        admin = {"authorization": f"Bearer {trainer_gw.admin_token}"}
        answers: dict[str, dict[str, httpx.Response]] = {}
        posts: dict[str, float] = {}  # rollout id -> the reward its agent posts to its own shard
        pending: asyncio.Queue[str] = asyncio.Queue()

        async def agent(request: RolloutRequest) -> RolloutResult:
            async with openai.AsyncOpenAI(base_url=request.base_url, api_key=request.session_id, max_retries=0) as c:
                out = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "12 * 7?"}])
                assert out.choices[0].message.content == REPLY
            mine = request.base_url.removesuffix("/v1")
            (other,) = [u.removesuffix("/v1") for u in shards.base_urls if u != request.base_url]
            reward = request.payload.get("post")
            async with httpx.AsyncClient() as client:
                answers[request.rollout_id] = {
                    # The shard that served no session of this rollout refuses, saying where to post.
                    "other": await client.post(f"{other}/admin/rollouts/{request.rollout_id}/reward",
                                               json={"reward": 0.1}, headers=admin),
                    "bad": await client.post(f"{mine}/admin/rollouts/{request.rollout_id}/reward",
                                             json={"reward": "high"}, headers=admin),
                }
                if reward is not None:  # the agent's own shard keeps it for the trainer
                    answers[request.rollout_id]["mine"] = await client.post(
                        f"{mine}/admin/rollouts/{request.rollout_id}/reward", json={"reward": reward}, headers=admin
                    )
                    posts[request.rollout_id] = reward
                if request.payload.get("lose_a_take"):  # a take whose answer never reaches the trainer
                    lost = await client.post(f"{mine}/admin/late_rewards/take", json={}, headers=admin)
                    assert request.rollout_id in lost.json()["rewards"], lost.text
                    for bad in ({"ack": -1}, {"ack": "1"}, {"ack": 1, "more": 2}):
                        refused = await client.post(f"{mine}/admin/late_rewards/take", json=bad, headers=admin)
                        assert refused.status_code == 400 and "invalid take at" in refused.text, (bad, refused.text)
            await pending.put(request.rollout_id)
            return RolloutResult(request.rollout_id, RolloutStatus.REWARD_PENDING)

        runner = RolloutRunner(
            gateway=None, base_url="", runtime=_SdkRuntime(agent), model_id="tiny", sessions=shards,
            limits=RolloutLimits(max_concurrency=4, timeout_s=60.0, reward_timeout_s=20.0),
        )
        sampling = SamplingParams(max_tokens=32)
        try:
            # Posted over HTTP to the agent's shard, before the rollout starts waiting.
            outcome = await asyncio.wait_for(runner.run_one({"post": 0.5}, group_id="g1", sampling=sampling), 60)
            assert outcome.result.status is RolloutStatus.OK and outcome.result.reward == 0.5, outcome.result.error
            assert len(outcome.rows) == 1 and outcome.rows[0].reward == 0.5 and outcome.rows[0].num_generated > 0
            rid = outcome.request.rollout_id
            assert answers[rid]["mine"].status_code == 200, answers[rid]["mine"].text
            assert answers[rid]["mine"].json() == {"rollout_id": rid, "reward": 0.5}

            refused = answers[rid]["other"]
            assert refused.status_code == 404
            assert f"no session of rollout {rid!r} was opened on this gateway shard" in refused.json()["error"]["message"]
            assert "the shard its agent called" in refused.text and "LateRewards.post" in refused.text
            assert answers[rid]["bad"].status_code == 400, answers[rid]["bad"].text

            # A take's answer lost on the way: nothing was acknowledged, so the reward still arrives.
            assert pending.get_nowait() == rid
            outcome = await asyncio.wait_for(
                runner.run_one({"post": 0.25, "lose_a_take": True}, group_id="g0", sampling=sampling), 60
            )
            assert outcome.result.status is RolloutStatus.OK and outcome.result.reward == 0.25, outcome.result.error
            assert pending.get_nowait() == outcome.request.rollout_id

            # Posted in the trainer's process while the rollout waits.
            rated = asyncio.create_task(runner.run_one({}, group_id="g2", sampling=sampling))
            rid2 = await asyncio.wait_for(pending.get(), 60)
            await asyncio.sleep(0.2)  # the runner harvests the session, then waits for the reward
            trainer_gw.late_rewards.post(rid2, 0.75)
            outcome = await asyncio.wait_for(rated, 60)
            assert outcome.result.status is RolloutStatus.OK and outcome.result.reward == 0.75, outcome.result.error

            # Nobody posts: reward_timeout, saying where a reward could have been posted.
            runner.reward_timeout_s = 0.3
            unrated = await runner.run_one({}, group_id="g3", sampling=sampling)
            assert unrated.result.status is RolloutStatus.REWARD_TIMEOUT
            assert "to the gateway the agent called" in (unrated.result.error or "")

            # Posted to the shard after the wait ran out: the trainer says it was not delivered.
            # (Its session was harvested: the shard remembers the rollout id, not the session.)
            late_rid = unrated.request.rollout_id
            accepted = []
            async with httpx.AsyncClient() as client:
                for url in shards.base_urls:
                    r = await client.post(f"{url.removesuffix('/v1')}/admin/rollouts/{late_rid}/reward",
                                          json={"reward": 1.0}, headers=admin)
                    accepted.append(r.status_code)
            assert sorted(accepted) == [200, 404]
            runner.reward_timeout_s = 2.0  # four collections while the next rollout waits
            waiting = await asyncio.wait_for(runner.run_one({}, group_id="g4", sampling=sampling), 60)
            assert waiting.result.status is RolloutStatus.REWARD_TIMEOUT
            assert list(posts.values()) == [0.5, 0.25]
        finally:
            await shards.aclose()

    asyncio.run(go())
    err = capsys.readouterr().err
    assert "a late reward posted to gateway shard" in err and "was not delivered" in err, err
    assert "stopped waiting for its reward (reward.timeout_s passed)" in err, err


def test_a_shards_book_keeps_rewards_for_the_rollouts_it_served_until_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ShardLateRewards``: a post for a rollout with a session opened on the shard is kept
    until ``take``; the ids it remembers are bounded (the oldest go first)."""
    from core.errors import ConfigError
    from core.gateway import late_rewards

    monkeypatch.setattr(late_rewards, "SHARD_MEMORY", 2)
    book = late_rewards.ShardLateRewards()
    for rid in ("r1", "r2", "r3"):
        book.opened(rid)
    book.post("r3", 1)
    book.post("r2", 0.25)
    with pytest.raises(ConfigError, match="no session of rollout 'r1' was opened on this gateway shard"):
        book.post("r1", 0.5)
    with pytest.raises(ConfigError, match="must be a finite number"):
        book.post("r2", float("nan"))
    first = book.take()
    assert first.rewards == {"r3": 1.0, "r2": 0.25} and first.through == 2
    assert book.take() == first, "not acknowledged (the answer may have been lost): handed over again"
    book.post("r2", 0.75)  # posted again after the take: replaces the reward, with a later number
    second = book.take(ack=first.through)
    assert second.rewards == {"r2": 0.75} and second.through == 3
    assert book.take(ack=second.through).rewards == {}
    # Rewards nobody takes are bounded too (the oldest posted go first, with a warning).
    book.opened("r4")
    book.post("r3", 0.5)
    book.post("r4", 0.5)
    book.opened("r5")
    book.post("r5", 0.5)
    assert list(book.take().rewards) == ["r4", "r5"]


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

    async def serve() -> tuple[Any, Any, bool]:
        server, shards = await rollout_stack._serve(cfg, gw, "")  # type: ignore[arg-type]
        collecting = shards._rewards_task is not None and not shards._rewards_task.done()
        await shards.aclose()
        return server, shards, collecting

    server, shards, collecting = asyncio.run(serve())
    assert server is None and shards is not None and started[0][1] == 2
    assert shards.late_rewards is gw.late_rewards
    assert collecting, "the shards collect the rewards posted to them while rollouts wait"


def test_the_collector_acknowledges_per_shard_and_delivers_what_it_received() -> None:
    """``RewardCollector.take``: each shard gets back the ``through`` of its own last answer,
    never another's, even when a later shard listens at a dead one's address; a failed take
    acknowledges nothing, so its rewards come again. The shards' HTTP side is a stand-in
    recording the requests (the real route is tested above)."""
    from core.gateway.late_rewards import LateRewards
    from core.rollout.shard_rewards import RewardCollector

    class Shard:
        def __init__(self, index: int) -> None:
            self.index, self.root_url, self.alive = index, "http://node:8000", True

        def name(self) -> str:
            return f"shard {self.index}"

    class Http:
        is_closed = False

        def __init__(self) -> None:
            self.sent: list[tuple[str, int]] = []
            self.answers: list[Any] = []

        async def post(self, url: str, json: dict[str, Any]) -> httpx.Response:
            self.sent.append((url, json["ack"]))
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return httpx.Response(200, json=answer, request=httpx.Request("POST", url))

    book = LateRewards()
    for rid in ("a", "b"):
        book.expect(rid)
    http = Http()
    collector = RewardCollector(http, [], book)
    old, new = Shard(0), Shard(1)
    http.answers = [
        {"rewards": {"a": 1.0}, "through": 5},
        {"rewards": {}, "through": 5},
        httpx.ReadTimeout("lost"),
        {"rewards": {"b": 0.5}, "through": 2},
        {"rewards": {}, "through": 2},
    ]

    async def go() -> None:
        await collector.take(old)
        await collector.take(old)
        await collector.take(new)  # same address as the dead one: its own count starts at 0
        await collector.take(new)
        await collector.take(new)

    asyncio.run(go())
    assert [ack for _, ack in http.sent] == [0, 5, 0, 0, 2]
    assert book._posted == {"a": 1.0, "b": 0.5}


def test_a_shard_that_hangs_delays_only_its_own_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RewardCollector.run``: while one shard never answers its take, the other shard's
    rewards keep arriving each poll (a stand-in HTTP side; the real route is tested above)."""
    from core.gateway.late_rewards import LateRewards
    from core.rollout import shard_rewards

    monkeypatch.setattr(shard_rewards, "POLL_S", 0.01)

    class Shard:
        def __init__(self, index: int) -> None:
            self.index, self.root_url, self.alive = index, f"http://shard-{index}", True

        def name(self) -> str:
            return f"shard {self.index}"

    class Http:
        is_closed = False
        calls = 0

        async def post(self, url: str, json: dict[str, Any]) -> httpx.Response:
            if url.startswith("http://shard-0"):
                await asyncio.Event().wait()  # hangs
            self.calls += 1
            answer = {"rewards": {f"r{self.calls}": 1.0}, "through": self.calls}
            return httpx.Response(200, json=answer, request=httpx.Request("POST", url))

    book = LateRewards()
    for i in range(1, 6):
        book.expect(f"r{i}")

    async def go() -> None:
        book.waiting = 1
        task = asyncio.create_task(shard_rewards.RewardCollector(Http(), [Shard(0), Shard(1)], book).run())
        deadline = asyncio.get_running_loop().time() + 5
        while len(book._posted) < 5:
            assert asyncio.get_running_loop().time() < deadline, book._posted
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(go())
    assert sorted(book._posted) == [f"r{i}" for i in range(1, 6)]

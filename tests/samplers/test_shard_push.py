"""Gateway shards follow a weight push (``gateway.shards`` with ``sampler.abort_on_push``):
every shard holds before the servers pause, and all learn the new version before any sends
again, so no shard mixes weights.

Two real shard processes (``python -m core.gateway shard``), the official openai SDK as
the agents, and a stand-in for vLLM's network edge (``tests/samplers/servers.py``; no vLLM
in CI) that pauses, aborts and resumes as vLLM's RL pause API does and, in its ``decode``
mode, samples each token as a function of the weights it serves, so a recorded token
shows which weights sampled it. The trainer's side is a ``VLLMSampler`` and a
``WeightPusher`` with the shards as its follower, as ``core.train`` wires them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai

from core.gateway import Gateway, GatewayConfig
from core.gateway.harvest import Harvest
from core.rollout.sessions import ShardLost
from core.rollout.shards import GatewayShards, shard_spec
from core.samplers import ScriptedSampler
from core.samplers.weights import PushReport, WeightPusher
from core.types import SamplingParams
from tests.samplers.servers import StandIn
from tests.samplers.test_fleet_weights import WEIGHTS, sampler_for, wait_for

TOKENS = 80


class _Logged:
    """The shards as the pusher's follower, writing ``held`` and ``releasing`` into the
    stand-in's event log, so the test sees what reached the server in between."""

    def __init__(self, shards: GatewayShards, events: list[str]) -> None:
        self.shards, self.events = shards, events

    async def hold(self, version: int) -> None:
        await self.shards.hold(version)
        self.events.append("held")

    async def release(self, report: PushReport | None) -> None:
        self.events.append("releasing")
        await self.shards.release(report)


async def _start(tok: Any, url: str, folder: Path) -> GatewayShards:
    gw = Gateway(tokenizer=tok, sampler=ScriptedSampler(tokenizer=tok), config=GatewayConfig(), model_id="tiny")
    sampler = {"kind": "vllm", "urls": [url], "abort_on_push": True, "health_interval_s": 0}
    return await GatewayShards.start(shard_spec(gw, sampler, folder), 2)


async def _turn(shards: GatewayShards, i: int) -> tuple[str, Any]:
    """One session with one agent turn; its id and the turn task."""
    sid, base_url = await shards.open(SamplingParams(max_tokens=TOKENS), {"rollout_id": f"r{i}"})

    async def agent() -> None:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=sid, max_retries=0, timeout=120) as client:
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"go {i}"}])

    return sid, asyncio.create_task(agent())


def _check_tokens(harvest: Harvest | None) -> list[tuple[int, int, int]]:
    """Every generated token is the one the weights its segment names sample at its
    position (launch for version 0, the pushed ones for 7); the row's segments."""
    assert harvest is not None and len(harvest.rows) == 1
    row = harvest.rows[0]
    row.validate()
    segments = [seg for turn in row.turns for seg in turn.version_segments()]
    for seg in segments:
        weights = "launch" if seg.weight_version == 0 else WEIGHTS
        for pos in range(seg.start, seg.end):
            token, logprob = StandIn.decoded(weights, pos)
            assert (row.token_ids[pos], row.logprobs[pos]) == (token, logprob), (seg, pos)
    return [(s.start, s.end, s.weight_version) for s in segments]


def test_two_shards_hold_through_a_push_and_continue_aborted_turns_on_the_new_weights(
    make_standin: Any, byte_tokenizer: Any, tmp_path: Path
) -> None:
    events: list[str] = []
    standin, url = make_standin(mode="decode", tick_s=0.05, reload_s=0.5, events=events)
    trainer = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> tuple[list[Any], list[Any], list[int], list[int]]:
        shards = await _start(byte_tokenizer, url, tmp_path)
        try:
            pusher = WeightPusher(trainer)
            pusher.followers.append(_Logged(shards, events))
            early = [await _turn(shards, i) for i in range(4)]  # two per shard, running at the push
            await wait_for(
                lambda: standin.running == 4 or any(t.done() for _, t in early), "four running generations", 60
            )
            assert standin.running == 4, [t.result() for _, t in early if t.done()]
            await asyncio.sleep(0.2)  # some tokens under the launch weights
            push = asyncio.create_task(pusher.push(WEIGHTS, 7))
            await wait_for(lambda: "held" in events, "the shards' hold", timeout_s=60)
            late = [await _turn(shards, i) for i in range(4, 6)]  # one per shard, sent while held
            report = await push
            assert report.updated == [url]
            await asyncio.gather(*(task for _, task in early + late))
            early_shards = [shards.shard_of(sid) for sid, _ in early]
            late_shards = [shards.shard_of(sid) for sid, _ in late]
            return (
                [await shards.harvest(sid) for sid, _ in early],
                [await shards.harvest(sid) for sid, _ in late],
                early_shards,
                late_shards,
            )
        finally:
            await shards.aclose()
            await trainer.aclose()

    early, late, early_shards, late_shards = asyncio.run(go())
    # Between the shards' acknowledgement and their release nothing reached the server.
    between = events[events.index("held") : events.index("releasing")]
    assert "standin:/collective_rpc" in between
    assert not [e for e in between if e.endswith("/generate")], between
    assert standin.paused_hits == [] and standin.pauses == ["mode=abort&clear_cache=true"]
    # Each shard's running turns were aborted and continued on the new weights in that shard.
    assert sorted(early_shards) == [0, 0, 1, 1] and sorted(late_shards) == [0, 1]
    for harvest in early:
        segments = _check_tokens(harvest)
        assert len(segments) == 2 and [v for _, _, v in segments] == [0, 7], segments
        assert segments[1][1] - segments[0][0] == TOKENS
    for harvest in late:  # sent while held: entirely under the new weights, labelled so
        assert [v for _, _, v in _check_tokens(harvest)] == [7]
    salts = [h.body["cache_salt"] for h in standin.generate_hits()]
    assert salts.count("tracerl-v0") == 4 and salts.count("tracerl-v7") == 6


class _JoinWhileHeld:
    """The shards as the pusher's follower; once they are held, one more shard joins
    (``catch_up``, as a per-node shard started after the run's start does) and an agent
    sends a turn to each shard, which must wait for the release."""

    def __init__(self, shards: GatewayShards, joining: Any, events: list[str]) -> None:
        self.shards, self.joining, self.events = shards, joining, events
        self.turns: list[tuple[str, asyncio.Task[None]]] = []
        self.version_on_joining = -1

    async def hold(self, version: int) -> None:
        await self.shards.hold(version)
        self.shards.shards.append(self.joining)
        await self.shards.catch_up(self.joining)
        self.events.append("joined")
        told = await self.shards._http.post(self.joining.root_url + "/admin/sampler", json={})  # changes nothing
        self.version_on_joining = told.json()["weight_version"]
        self.turns = [await _turn(self.shards, i) for i in (8, 9)]  # one on each shard
        await asyncio.sleep(0.5)  # time for the turns to reach a server, were they not held

    async def release(self, report: PushReport | None) -> None:
        self.events.append("releasing")
        await self.shards.release(report)


def test_a_shard_that_joins_during_a_push_is_held_and_samples_under_the_new_version(
    make_standin: Any, byte_tokenizer: Any, tmp_path: Path
) -> None:
    """``GatewayShards.catch_up``: a shard that joins while the others are held for a push
    learns the version they were told (3, from an earlier push) and is held too; its turn
    reaches the server only after the release, entirely under the new weights (7)."""
    events: list[str] = []
    standin, url = make_standin(mode="decode", tick_s=0.05, reload_s=0.5, events=events)
    trainer = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> dict[int, Harvest | None]:
        shards = await _start(byte_tokenizer, url, tmp_path)
        try:
            joining = shards.shards.pop()  # as if it started after the others
            # Told to the others only: two pushes' retirements (a server the test never ran), version 3.
            await shards.set_weight_version(2, retired={"http://127.0.0.1:9": "gone"})
            await shards.set_weight_version(3, retired={"http://127.0.0.1:10": "gone too"})
            assert shards._fleet_state["retired"] == {"http://127.0.0.1:9": "gone", "http://127.0.0.1:10": "gone too"}
            follower = _JoinWhileHeld(shards, joining, events)
            pusher = WeightPusher(trainer)
            pusher.followers.append(follower)
            report = await pusher.push(WEIGHTS, 7)
            assert report.updated == [url] and len(follower.turns) == 2
            assert follower.version_on_joining == 3
            await asyncio.wait_for(asyncio.gather(*(task for _, task in follower.turns)), 60)
            where = {shards.shard_of(sid): sid for sid, _ in follower.turns}
            return {shard: await shards.harvest(sid) for shard, sid in where.items()}
        finally:
            await shards.aclose()
            await trainer.aclose()

    harvests = asyncio.run(go())
    assert sorted(harvests) == [0, 1]  # shard 1 is the one that joined
    between = events[events.index("joined") : events.index("releasing")]
    assert not [e for e in between if e.endswith("/generate")], between
    for harvest in harvests.values():
        assert [v for _, _, v in _check_tokens(harvest)] == [7]


def test_a_shard_that_does_not_acknowledge_the_hold_is_stopped_and_fails_its_rollouts(
    make_standin: Any, byte_tokenizer: Any, tmp_path: Path
) -> None:
    """A frozen shard (SIGSTOP) cannot hold: the push goes on without it, the shard is
    stopped, and its sessions fail naming why; the other shard samples under the new version."""
    import signal

    standin, url = make_standin(mode="decode", tick_s=0.01, events=[])
    trainer = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> None:
        shards = await _start(byte_tokenizer, url, tmp_path)
        shards.hold_timeout_s = 2.0
        try:
            pusher = WeightPusher(trainer)
            pusher.followers.append(shards)
            opened = [await shards.open(SamplingParams(max_tokens=4), {"rollout_id": f"r{i}"}) for i in range(2)]
            frozen = shards.shards[1]
            frozen.proc.send_signal(signal.SIGSTOP)
            report = await pusher.push(WEIGHTS, 7)
            assert report.updated == [url] and frozen.proc.returncode is not None
            by_shard = {shards.shard_of(sid): (sid, base) for sid, base in opened}
            sid, base = by_shard[0]
            async with openai.AsyncOpenAI(base_url=base, api_key=sid, max_retries=0, timeout=60) as client:
                await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
            _check_tokens(await shards.harvest(sid))
            assert standin.generate_hits()[-1].body["cache_salt"] == "tracerl-v7"
            try:
                await shards.harvest(by_shard[1][0])
            except ShardLost as exc:
                message = str(exc)
            else:
                raise AssertionError("the stopped shard's session was harvested")
            assert "gateway shard 1" in message
            assert "did not acknowledge the hold for the weight push to version 7" in message
            assert "no answer within 2 s" in message
        finally:
            await shards.aclose()
            await trainer.aclose()

    asyncio.run(go())

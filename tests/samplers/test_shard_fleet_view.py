"""Gateway shards route only to the servers the trainer says serve the current weights.

A server that was down during a push did not get the new weights: the trainer routes it
nothing until it is back and re-pushed (``WeightPusher.readmit``), and so must every shard,
whose own health checks cannot know what weights a server holds. One real shard process,
two stand-ins for vLLM's edge (``tests/samplers/servers.py``; no vLLM in CI); the trainer's
side is a ``VLLMSampler``, its ``WeightPusher`` and the shards following it as ``core.train``
wires them (``GatewayShards.follow``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from core.gateway import Gateway, GatewayConfig
from core.rollout.shards import GatewayShards, shard_spec
from core.samplers import ScriptedSampler
from core.samplers.http_sampler import HttpSampler
from core.samplers.weights import WeightPusher
from core.types import SamplingParams
from tests.samplers.test_fleet_weights import WEIGHTS, sampler_for, wait_for


@dataclass
class _Fleet:
    """What ``GatewayShards.follow`` reads of ``core.trainer.fleet.Fleet``."""

    sampler: HttpSampler
    pusher: WeightPusher
    after_push: list[Any] = field(default_factory=list)


async def _turns(shards: GatewayShards, n: int) -> None:
    for i in range(n):
        sid, base_url = await shards.open(SamplingParams(max_tokens=3), {"rollout_id": f"r{i}"})
        async with openai.AsyncOpenAI(base_url=base_url, api_key=sid, max_retries=0, timeout=60) as client:
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"go {i}"}])
        assert await shards.harvest(sid) is not None


def test_a_server_down_at_the_push_gets_no_shard_traffic_until_the_trainer_re_pushes_it(
    make_standin: Any, byte_tokenizer: Any, tmp_path: Path
) -> None:
    a, url_a = make_standin(name="a")
    b, url_b = make_standin(name="b")
    trainer = sampler_for("vllm", [url_a, url_b], health_interval_s=0.1)

    async def go() -> None:
        gw = Gateway(tokenizer=byte_tokenizer, sampler=ScriptedSampler(tokenizer=byte_tokenizer),
                     config=GatewayConfig(), model_id="tiny")
        # The shard's own health checks are off: only the trainer's word can keep it off a server.
        spec = shard_spec(gw, {"kind": "vllm", "urls": [url_a, url_b], "health_interval_s": 0}, tmp_path)
        shards = await GatewayShards.start(spec, 1)
        try:
            pusher = WeightPusher(trainer)
            shards.follow(_Fleet(trainer, pusher))
            a.health_status = 503  # down: the trainer's checks take it out of rotation
            await wait_for(lambda: not trainer.pool.servers[0].healthy, "server a out of rotation")
            report = await pusher.push(WEIGHTS, 7)
            assert report.waiting == [url_a] and report.updated == [url_b]
            assert a.weights == "launch" and b.weights == WEIGHTS
            # Its health checks fail, but it still answers generate requests with its old weights.
            await asyncio.sleep(2.5)  # the shard hears the trainer's view within a second
            await _turns(shards, 8)
            assert a.generate_hits() == [] and len(b.generate_hits()) == 8
            a.health_status = 200  # back: the trainer re-pushes it before any traffic
            await wait_for(lambda: a.weights == WEIGHTS, "the re-push of server a")
            await wait_for(lambda: not trainer.pool.servers[0].needs_weights, "server a back in rotation")
            await asyncio.sleep(2.5)  # the shards hear of it within a second
            await _turns(shards, 8)
        finally:
            await shards.aclose()
            await trainer.aclose()

    asyncio.run(go())
    assert a.generate_hits() and b.generate_hits()  # a is back in the shard's rotation
    assert set(a.served_with) == {WEIGHTS}  # and never served a turn from its old weights
    assert {h.body["cache_salt"] for h in a.generate_hits() + b.generate_hits()} == {"tracerl-v7"}


def test_the_trainer_checks_its_servers_for_the_shards_but_not_while_they_sleep() -> None:
    """``follow`` starts the trainer's health checks (its sampler may never sample, and the
    shards' view comes from them), except while the sampler is held: the servers sleep
    (``sampler.sleep_during_train``) and a sleeping engine may fail a check."""
    trainer = sampler_for("vllm", ["http://127.0.0.1:9"], health_interval_s=30)

    async def go() -> None:
        shards = GatewayShards([], "token", "")
        trainer.hold()  # asleep
        shards.follow(_Fleet(trainer, WeightPusher(trainer)))
        await asyncio.sleep(0.2)
        assert trainer.pool._task is None
        trainer.release()
        await wait_for(lambda: trainer.pool._task is not None, "the trainer's health checks")
        await shards.aclose()
        await trainer.aclose()

    asyncio.run(go())

"""The sharded gateway (``gateway.shards``): N real gateway processes on 127.0.0.1.

Each test starts ``python -m core.gateway shard`` processes through ``GatewayShards``
and drives them with the official openai SDK as the agent, the way an agent process
does (its base URL and session id from the runner). The model is scripted: a
shard's sampler answers a fixed reply with deterministic logprobs, the only thing
faked, since a real model's output cannot be scripted.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from core.errors import ConfigError
from core.gateway import Gateway, GatewayConfig
from core.gateway.harvest import Harvest
from core.rollout import RolloutLimits, RolloutRunner
from core.rollout.shards import GatewayShards, ShardSpec, shard_spec
from core.rollout.stack import shard_sampler
from core.samplers import ScriptedSampler
from core.types import RolloutRequest, RolloutResult, RolloutStatus, SamplingParams

REPLY = "The answer is 84."


def _spec(tok: Any, folder: Path) -> ShardSpec:
    gw = Gateway(tokenizer=tok, sampler=ScriptedSampler(tokenizer=tok), config=GatewayConfig(), model_id="tiny")
    return shard_spec(gw, {"kind": "scripted", "reply": REPLY}, folder)


async def _agent(base_url: str, sid: str, turns: int = 2, messages: list[dict[str, Any]] | None = None) -> None:
    """``turns`` model calls, each resending the history (``messages``, kept by the caller)."""
    if messages is None:
        messages = [{"role": "user", "content": "What is 12 * 7?"}]
    async with openai.AsyncOpenAI(base_url=base_url, api_key=sid, max_retries=0) as client:
        for _ in range(turns):
            out = await client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
            assert out.choices[0].message.content == REPLY
            messages += [{"role": "assistant", "content": REPLY}, {"role": "user", "content": "Sure?"}]


async def _sessions(shards: GatewayShards, n: int) -> tuple[list[Harvest | None], dict[str, float], set[int]]:
    """``n`` sessions, each one agent of two turns; their harvests (in order), the summed
    stats before harvesting, and the shards that held them."""
    opened = [
        await shards.open(SamplingParams(max_tokens=32, seed=i), {"rollout_id": f"r{i}", "group_id": "g"})
        for i in range(n)
    ]
    held = {shards.shard_of(sid) for sid, _ in opened}
    await asyncio.gather(*(_agent(url, sid) for sid, url in opened))
    stats = await shards.stats()
    return [await shards.harvest(sid) for sid, _ in opened], stats, held


def test_two_shards_give_the_rows_and_counters_of_one(byte_tokenizer: Any, tmp_path: Path) -> None:
    async def run(count: int) -> tuple[list[Harvest | None], dict[str, float], set[int]]:
        shards = await GatewayShards.start(_spec(byte_tokenizer, tmp_path / str(count)), count)
        try:
            return await _sessions(shards, 4)
        finally:
            await shards.aclose()
            assert all(s.proc.returncode is not None for s in shards.shards)

    one, stats_one, held_one = asyncio.run(run(1))
    two, stats_two, held_two = asyncio.run(run(2))
    assert held_one == {0} and held_two == {0, 1}  # round robin: both shards held sessions
    for key in ("sessions", "turns"):
        assert stats_one[key] == stats_two[key]
    assert stats_two["turns"] == 8
    for a, b in zip(one, two, strict=True):
        assert a is not None and b is not None
        assert a.counters == b.counters and a.counters["model_turns"] == 2
        assert a.conversation == b.conversation
        assert len(a.rows) == len(b.rows) == 1
        ra, rb = a.rows[0], dataclasses.replace(b.rows[0], session_id=a.rows[0].session_id)
        assert ra == rb and ra.num_generated > 0 and ra.rollout_id is not None
        ra.validate()


class _SdkRuntime:
    """Runs each rollout as an openai-SDK agent at the request's base URL and session id,
    in this process: what an agent process of the local runtime does, without the spawn."""

    def __init__(self, agent: Callable[[RolloutRequest], Awaitable[RolloutResult]]) -> None:
        self.agent = agent

    async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
        return await self.agent(request)

    async def cancel(self, rollout_id: str) -> None:
        return None


def test_a_killed_shard_fails_only_its_own_rollouts(byte_tokenizer: Any, tmp_path: Path) -> None:
    async def go() -> None:
        shards = await GatewayShards.start(_spec(byte_tokenizer, tmp_path), 2)
        first_turns = asyncio.Barrier(5)
        killed = asyncio.Event()

        async def agent(request: RolloutRequest) -> RolloutResult:
            history: list[dict[str, Any]] = [{"role": "user", "content": "What is 12 * 7?"}]
            try:
                await _agent(request.base_url, request.session_id, 1, history)
                if not killed.is_set():  # the first four meet, then one shard dies
                    await first_turns.wait()
                    await killed.wait()
                await _agent(request.base_url, request.session_id, 1, history)
            except openai.APIConnectionError as exc:
                return RolloutResult(request.rollout_id, RolloutStatus.CRASHED, error=f"agent: {exc}")
            return RolloutResult(request.rollout_id, RolloutStatus.OK, reward=1.0)

        runner = RolloutRunner(
            gateway=None, base_url="", runtime=_SdkRuntime(agent), model_id="tiny",
            limits=RolloutLimits(max_concurrency=8, timeout_s=60.0), sessions=shards,
        )
        try:
            rollouts = [
                asyncio.create_task(runner.run_one({}, group_id="g", sampling=SamplingParams(max_tokens=32)))
                for _ in range(4)
            ]
            await first_turns.wait()
            dead = shards.shards[1]
            dead.proc.kill()
            await dead.proc.wait()
            killed.set()
            outcomes = await asyncio.gather(*rollouts)
            by_shard: dict[bool, list[Any]] = {True: [], False: []}
            for o in outcomes:
                by_shard[o.request.base_url == dead.base_url].append(o)
            assert len(by_shard[True]) == len(by_shard[False]) == 2
            for o in by_shard[False]:  # the live shard's rollouts trained as if nothing happened
                assert o.result.status is RolloutStatus.OK, o.result.error
                assert len(o.rows) == 1 and o.rows[0].metadata["turns"] == 2
            for o in by_shard[True]:  # the dead shard's: failed, saying which shard and why
                assert o.result.status is RolloutStatus.CRASHED
                assert o.rows == [] and o.faults["session_lost"] == 1
                assert "gateway shard 1" in (o.result.error or "")
                assert "exited with code -9" in (o.result.error or "")
            # The run goes on: new rollouts land on the shard still alive, which samples under
            # the weight version the trainer announces after a push.
            await shards.set_weight_version(3)
            after = await runner.run_one({}, group_id="g2", sampling=SamplingParams(max_tokens=32))
            assert after.result.status is RolloutStatus.OK and after.request.base_url == shards.shards[0].base_url
            assert [t.weight_version for t in after.rows[0].turns] == [3, 3]
        finally:
            await shards.aclose()

    asyncio.run(go())


def test_a_shard_that_cannot_start_says_so(byte_tokenizer: Any, tmp_path: Path) -> None:
    spec = dataclasses.replace(_spec(byte_tokenizer, tmp_path), sampler={"kind": "nonsense"})

    async def go() -> None:
        with pytest.raises(Exception, match=r"gateway shard 0 .* exited with code 1 before listening"):
            await GatewayShards.start(spec, 1, timeout_s=120)

    asyncio.run(go())


def test_shards_refuse_several_policies(byte_tokenizer: Any, tmp_path: Path) -> None:
    from core.gateway.policies import PolicyRoutes

    gw = Gateway(
        tokenizer=byte_tokenizer, sampler=ScriptedSampler(tokenizer=byte_tokenizer), model_id="tiny",
        policies=PolicyRoutes(names=("solver", "critic")),
    )
    with pytest.raises(ConfigError, match=r"gateway.shards above 1 serves one policy, but policies configures"):
        shard_spec(gw, {"kind": "scripted"}, tmp_path)


def test_shards_refuse_a_sampler_inside_the_trainer() -> None:
    with pytest.raises(ConfigError, match=r"gateway.shards=2 needs a sampler every gateway process can call"):
        shard_sampler({"kind": "backend"}, 2)
    assert shard_sampler({"kind": "sglang", "urls": ["http://127.0.0.1:30000"]}, 2)["urls"] == [
        "http://127.0.0.1:30000"
    ]
    with pytest.raises(ConfigError, match=r"gateway.shards must be an integer >= 1"):
        GatewayConfig(shards=0)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_training_run_with_two_shards(tmp_path: Path) -> None:
    """``python -m core.train gateway.shards=2`` with ``python -m tracerl_local.serve`` as the
    fleet: every rollout of every step lands, each step's turns come from the weights the
    step before pushed, and nothing fails."""
    import json
    import subprocess
    import sys

    from core.rundir.metrics import read_metrics
    from core.rundir.traces import read_traces, rows_of

    serve = subprocess.Popen(
        [sys.executable, "-m", "tracerl_local.serve", "--port", "0", "--task", "succ_digit"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert serve.stdout is not None
        url = json.loads(serve.stdout.readline())["url"]
        run_dir = tmp_path / "run"
        proc = subprocess.run(
            [sys.executable, "-m", "core.train", f"run_dir={run_dir}", "trainer.progress=false",
             "trainer.loggers=[jsonl]", "trainer.max_steps=2", "trainer.batch_size=4", "trainer.group_size=4",
             "sampler=sglang", f"sampler.urls=[{url}]", "gateway.shards=2"],
            capture_output=True, text=True, timeout=800,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        serve.terminate()
        serve.wait(30)
        if serve.stdout is not None:
            serve.stdout.close()
    steps = {int(r["step"]): r for r in read_metrics(run_dir / "metrics.jsonl") if "rollouts/total" in r}
    for step in (1, 2):
        assert steps[step]["rollouts/total"] == 16 and steps[step]["rollouts/failed"] == 0
        stored = read_traces(run_dir / "traces" / f"train_{step:06d}.jsonl.gz")
        rows = [row for r in stored.rollouts for row in rows_of(r)]
        assert len(rows) == 16 and all(row.num_generated > 0 for row in rows)
        assert {t.weight_version for row in rows for t in row.turns} == {step - 1}


def test_a_run_sampling_with_its_backend_refuses_shards(tmp_path: Path) -> None:
    """``gateway.shards=2`` with the backend's own sampler fails before any rollout, saying what to use."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "core.train", f"run_dir={tmp_path / 'run'}", "trainer.progress=false",
         "trainer.max_steps=1", "gateway.shards=2"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode != 0
    assert "gateway.shards=2 needs a sampler every gateway process can call" in proc.stderr + proc.stdout
    assert "sampler=sglang" in proc.stderr + proc.stdout

"""``gateway.shards=per_node`` on a real two-node Ray cluster (loopback; marker ``ray``).

A gateway shard runs on each node (``core.rollout.node_shards``) and agents run in the
ray runtime's actors, one per node (``shard_agent.py``: two calls with the official
openai SDK, the second resending the history). The model is scripted, the only thing
faked: a shard's sampler answers a fixed reply with deterministic logprobs, as the
trainer's in-process gateway does with the same scripted sampler, so the rows of both
must be equal to the last token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from core.gateway import Gateway, GatewayConfig, GatewayServer
from core.rollout import RolloutLimits, RolloutOutcome, RolloutRunner
from core.rollout.node_shards import SHARD_ACTOR_PREFIX, NodeShards
from core.rollout.shards import shard_spec
from core.runtime.ray import RayRuntime
from core.samplers import ScriptedSampler, encode_reply
from core.types import RolloutStatus, SamplingParams, TraceRecord
from tests.runtime.ray.cluster.ray_test_cluster import agent_actor_states, alive

pytestmark = pytest.mark.ray

AGENT = "shard_agent:app"
HERE = Path(__file__).resolve().parent
AGENT_ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}
"""The agent module (``shard_agent.py``) is in this folder: its processes need it on their path."""
REPLY = "The answer is 84."
SAMPLING = SamplingParams(max_tokens=32)


def _gateway(tok: Any) -> Gateway:
    sampler = ScriptedSampler(default=encode_reply(tok, REPLY), tokenizer=tok, record_calls=False)
    return Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(), model_id="tiny")


def _runtime(cluster: Cluster, gateway_host: str) -> RayRuntime:
    return RayRuntime(
        AGENT, address=cluster.address, num_actors=2, agents_per_actor=4, num_cpus_per_agent=0.1,
        gateway_host=gateway_host, startup_timeout_s=180, env=AGENT_ENV,
    )


def _runner(runtime: RayRuntime, sessions: Any = None, gateway: Any = None, base_url: str = "") -> RolloutRunner:
    return RolloutRunner(
        gateway=gateway, base_url=base_url, runtime=runtime, model_id="tiny",
        limits=RolloutLimits(max_concurrency=16, timeout_s=90.0), sessions=sessions,
    )


async def _node_of_actor_pid(rt: RayRuntime) -> dict[int, str]:
    """Each agent actor's pid -> its node (an agent process's parent is its actor)."""
    infos = await asyncio.gather(*(_await(h.ready.remote()) for h in rt.actors))
    return {int(i["pid"]): str(i["node_id"]) for i in infos}


async def _await(ref: Any) -> Any:
    return await ref


def _payloads(n: int, gate: Path | None = None) -> list[dict[str, Any]]:
    return [{"question": f"What is {i} * 7?", "n": i, "gate": str(gate or "")} for i in range(n)]


async def _reached_first_reply(gate: Path, n: int, what: str) -> None:
    """Wait until ``n`` gated rollouts got their first reply (``what``: the failure's message)."""
    deadline = time.monotonic() + 120
    while len(list(gate.glob("*.first"))) < n:
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def _close_and_check(shards: NodeShards) -> None:
    """``shards.aclose()``, then every shard process must be gone within 15 s."""
    pids = [s.pid for s in shards.node_shards]
    await shards.aclose()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not [p for p in pids if alive(p)], "a shard process outlived aclose"


def _plain(row: TraceRecord) -> TraceRecord:
    """``row`` without what names its run (session and rollout ids)."""
    return dataclasses.replace(row, session_id="", rollout_id=None, group_id=None, metadata={})


def _by_question(outcomes: list[RolloutOutcome]) -> dict[int, RolloutOutcome]:
    return {int(o.request.payload["n"]): o for o in outcomes}


def test_each_nodes_agents_call_their_nodes_shard_and_the_rows_are_one_gateways(
    ray_cluster: Cluster, byte_tokenizer: Any, tmp_path: Path
) -> None:
    """Eight rollouts over two nodes: one shard per node; every rollout's session is on the
    shard of the node its agent ran on (so the sessions each shard held are the rollouts
    placed on its node); every trace arrives, equal to what one in-process gateway records
    for the same rollouts; stopping leaves no shard actor or process behind."""
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    payloads = _payloads(8)
    folders_before = set(Path(tempfile.gettempdir()).glob("tracerl-node-shard-*"))

    async def sharded() -> tuple[list[RolloutOutcome], dict[int, str], dict[str, int], dict[str, str], RayRuntime]:
        rt = _runtime(ray_cluster, gateway_host="")
        await rt.start()
        try:
            spec = shard_spec(_gateway(byte_tokenizer), {"kind": "scripted", "reply": REPLY}, tmp_path)
            shards = await NodeShards.start_on_nodes(spec, rt)
            try:
                assert sorted(s.node_id for s in shards.node_shards) == sorted(nodes)  # one on each node
                runner = _runner(rt, sessions=shards)
                outcomes = await asyncio.gather(*(runner.run_one(p, group_id="g", sampling=SAMPLING) for p in payloads))
                shard_url = {s.node_id: s.base_url for s in shards.node_shards}
                return outcomes, await _node_of_actor_pid(rt), dict(shards.sessions_per_node), shard_url, rt
            finally:
                await _close_and_check(shards)
        finally:
            await rt.aclose()

    async def one_gateway() -> list[RolloutOutcome]:
        gw = _gateway(byte_tokenizer)
        server = GatewayServer(gw, host="127.0.0.1", port=0)
        await server.start()
        rt = _runtime(ray_cluster, gateway_host="127.0.0.1")
        try:
            await rt.start()
            runner = _runner(rt, gateway=gw, base_url=server.base_url)
            return await asyncio.gather(*(runner.run_one(p, group_id="g", sampling=SAMPLING) for p in payloads))
        finally:
            await rt.aclose()
            await server.stop()

    outcomes, actor_node, sessions_per_node, shard_url, rt = asyncio.run(sharded())
    assert [o.result.status for o in outcomes] == [RolloutStatus.OK] * 8, [o.result.error for o in outcomes]
    assert len(set(shard_url.values())) == 2
    for o in outcomes:
        node = actor_node[int(o.result.metrics["agent_parent_pid"])]  # where its agent ran
        assert o.request.base_url == shard_url[node], (node, o.request.base_url, shard_url)
    assert sessions_per_node == dict(rt.rollouts_per_node) and set(sessions_per_node) == nodes, (
        sessions_per_node, rt.rollouts_per_node,
    )
    assert agent_actor_states(f"{SHARD_ACTOR_PREFIX}{rt.run_id}") and set(
        agent_actor_states(f"{SHARD_ACTOR_PREFIX}{rt.run_id}").values()
    ) == {"DEAD"}
    # The shards' copies of the spec (with the admin token) and tokenizer are gone.
    assert set(Path(tempfile.gettempdir()).glob("tracerl-node-shard-*")) <= folders_before

    single = _by_question(asyncio.run(one_gateway()))
    for n, o in _by_question(outcomes).items():
        one = single[n]
        assert one.result.status is RolloutStatus.OK
        assert len(o.rows) == len(one.rows) == 1 and o.faults == one.faults
        assert [len(r.turns) for r in o.rows] == [2]
        assert _plain(o.rows[0]) == _plain(one.rows[0]), n
        assert o.rows[0].rollout_id == o.request.rollout_id and o.rows[0].num_generated > 0
        o.rows[0].validate()
        assert o.conversation == one.conversation


def test_a_dead_node_shard_fails_only_its_nodes_rollouts(
    ray_cluster: Cluster, byte_tokenizer: Any, tmp_path: Path
) -> None:
    """While every rollout waits between its two model calls, one node's shard process is
    killed: exactly that node's rollouts end ``crashed`` with an error naming the shard, its
    node and its exit code; the other node's train as if nothing happened; the next
    rollouts all go to the node whose shard is alive, and the weight version the trainer
    announces reaches it."""
    gate = tmp_path / "gate"
    gate.mkdir()

    async def go() -> None:
        rt = _runtime(ray_cluster, gateway_host="")
        await rt.start()
        try:
            spec = shard_spec(_gateway(byte_tokenizer), {"kind": "scripted", "reply": REPLY}, tmp_path)
            shards = await NodeShards.start_on_nodes(spec, rt)
            try:
                runner = _runner(rt, sessions=shards)
                tasks = [
                    asyncio.create_task(runner.run_one(p, group_id="g", sampling=SAMPLING)) for p in _payloads(8, gate)
                ]
                await _reached_first_reply(gate, 8, "the rollouts never reached their first reply")
                victim, survivor = shards.node_shards[1], shards.node_shards[0]
                os.kill(victim.pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while victim.alive:
                    assert time.monotonic() < deadline, "the trainer never learned the shard died"
                    await asyncio.sleep(0.05)
                (gate / "go").write_text("")
                outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 120)
                dead = [o for o in outcomes if o.request.base_url == victim.base_url]
                live = [o for o in outcomes if o.request.base_url == survivor.base_url]
                assert len(dead) == len(live) == 4, [o.request.base_url for o in outcomes]
                for o in live:
                    assert o.result.status is RolloutStatus.OK, o.result.error
                    assert len(o.rows) == 1 and len(o.rows[0].turns) == 2
                for o in dead:
                    error = o.result.error or ""
                    assert o.result.status is RolloutStatus.CRASHED and o.rows == [], error
                    assert o.faults["session_lost"] == 1
                    assert f"gateway shard 1 on Ray node {victim.node_id[:12]}" in error, error
                    assert "its process exited with code -9" in error, error

                await shards.set_weight_version(5)
                after = await asyncio.gather(
                    *(runner.run_one(p, group_id="g2", sampling=SAMPLING) for p in _payloads(4))
                )
                assert [o.result.status for o in after] == [RolloutStatus.OK] * 4, [o.result.error for o in after]
                assert {o.request.base_url for o in after} == {survivor.base_url}
                assert {t.weight_version for o in after for t in o.rows[0].turns} == {5}
                assert shards.sessions_per_node[victim.node_id] == 4
            finally:
                await shards.aclose()
        finally:
            await rt.aclose()

    asyncio.run(go())


def test_a_node_that_gets_agent_actors_later_gets_its_own_shard(
    ray_cluster: Cluster, byte_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node with agent actors and no shard gets one when the runtime first looks for a
    place there, told the weight version the other shards were told, and its rollouts then
    run on it. (The run's shards are started as if only the first node had actors: what a
    node added by an autoscaler, or an actor Ray recreated elsewhere, looks like to them.)"""
    gate = tmp_path / "gate"
    gate.mkdir()

    async def go() -> None:
        rt = _runtime(ray_cluster, gateway_host="")
        await rt.start()
        try:
            nodes = rt.node_ids
            assert len(nodes) == 2
            spec = shard_spec(_gateway(byte_tokenizer), {"kind": "scripted", "reply": REPLY}, tmp_path)
            monkeypatch.setattr(RayRuntime, "node_ids", property(lambda self: nodes[:1]))
            shards = await NodeShards.start_on_nodes(spec, rt)
            monkeypatch.undo()
            try:
                assert [s.node_id for s in shards.node_shards] == nodes[:1]
                await shards.set_weight_version(3)
                runner = _runner(rt, sessions=shards)
                tasks = [
                    asyncio.create_task(runner.run_one(p, group_id="g", sampling=SAMPLING)) for p in _payloads(12, gate)
                ]
                # The first node's actor takes four (agents_per_actor); the second node's four
                # more once its shard is up; all eight wait at the gate, the rest queue.
                await _reached_first_reply(gate, 8, "the second node never took rollouts")
                (gate / "go").write_text("")
                outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 120)
                assert [o.result.status for o in outcomes] == [RolloutStatus.OK] * 12, [
                    o.result.error for o in outcomes
                ]
                late = shards.node_shards[1]
                assert late.node_id == nodes[1] and late.alive and late.index == 1
                on_late = [o for o in outcomes if o.request.base_url == late.base_url]
                assert len(on_late) >= 4 and shards.sessions_per_node[nodes[1]] == len(on_late)
                for o in outcomes:
                    assert len(o.rows) == 1 and len(o.rows[0].turns) == 2
                    assert {t.weight_version for t in o.rows[0].turns} == {3}, o.request.base_url
            finally:
                await _close_and_check(shards)
        finally:
            await rt.aclose()

    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_training_run_with_a_gateway_shard_per_node(ray_cluster: Cluster, tmp_path: Path) -> None:
    """``python -m core.train runtime=ray gateway.shards=per_node`` on the two-node cluster,
    with ``python -m tracerl_local.serve`` as the fleet: every rollout of both steps lands
    and trains, and each step's turns come from the weights the step before pushed (the
    version reaches the node shards)."""
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
             "trainer.loggers=[jsonl]", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=4",
             "trainer.eval_size=0", "sampler=sglang", f"sampler.urls=[{url}]", "runtime=ray",
             f"runtime.address={ray_cluster.address}", "runtime.num_actors=2", "runtime.agents_per_actor=4",
             "runtime.num_cpus_per_agent=0.1", "runtime.startup_timeout_s=180", "gateway.shards=per_node"],
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
        assert steps[step]["rollouts/total"] == 8 and steps[step]["rollouts/failed"] == 0
        stored = read_traces(run_dir / "traces" / f"train_{step:06d}.jsonl.gz")
        rows = [row for r in stored.rollouts for row in rows_of(r)]
        assert len(rows) == 8 and all(row.num_generated > 0 for row in rows)
        assert {t.weight_version for row in rows for t in row.turns} == {step - 1}

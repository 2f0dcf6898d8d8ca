"""``runtime=ray`` on a real two-node Ray cluster (loopback): conformance, placement, actor
death, cleanup, and the gateway preflight. Marker ``ray``: ``python -m pytest -m ray``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from core.errors import ConfigError
from core.runtime.ray import RayRuntime
from core.runtime.ray.runtime import ACTOR_PREFIX
from core.testing import CONFORMANCE_AGENT, RuntimeConformance, build_runtime
from core.testing.runtime_conformance import conformance_request
from core.types import RolloutStatus
from tests.runtime.moto_s3 import moto_s3_server
from tests.runtime.ray.cluster.ray_test_cluster import agent_actor_states, agent_actors

pytestmark = pytest.mark.ray

SMALL = ["runtime.num_actors=2", "runtime.agents_per_actor=4", "runtime.num_cpus_per_agent=0.1"]


def _build(cluster: Cluster, *extra: str) -> RayRuntime:
    rt = build_runtime(
        "ray",
        [f"task.agent={CONFORMANCE_AGENT}", f"runtime.address={cluster.address}", *SMALL, *extra],
    )
    assert isinstance(rt, RayRuntime)
    return rt


class TestRayRuntimeConformance(RuntimeConformance):
    """Every fault case of ``runtime=local`` (raise, hang, die, bad/missing reward, cancel, aclose)."""

    @pytest.fixture
    def runtime(self, ray_cluster: Cluster) -> Any:
        rt = _build(ray_cluster)
        assert rt.config.num_actors == 2 and rt.config.agents_per_actor == 4
        return rt


def _run(rt: RayRuntime, body: Any) -> Any:
    async def main() -> Any:
        await rt.start()
        try:
            return await body()
        finally:
            await rt.aclose()

    return asyncio.run(main())


def test_rollouts_land_on_both_nodes_and_aclose_leaves_no_actors(ray_cluster: Cluster) -> None:
    """SPREAD puts one actor on each node; rollouts come back from both; after ``aclose``
    every actor is dead and the cluster's CPUs are free again."""
    rt = _build(ray_cluster)
    total_cpu = ray.cluster_resources()["CPU"]
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2

    async def body() -> list[Any]:
        assert len(agent_actor_states(f"{ACTOR_PREFIX}{rt.run_id}")) == 2
        requests = [conformance_request({"mode": "ok", "reward": 0.5, "sleep_s": 0.2}) for _ in range(16)]
        return await asyncio.gather(*(rt.run_rollout(r) for r in requests))

    results = _run(rt, body)
    assert [r.status for r in results] == [RolloutStatus.OK] * 16, [r.error for r in results]
    assert set(rt.rollouts_per_node) == nodes, rt.rollouts_per_node
    assert min(rt.rollouts_per_node.values()) >= 4, rt.rollouts_per_node
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        states = agent_actor_states(f"{ACTOR_PREFIX}{rt.run_id}")
        if set(states.values()) == {"DEAD"} and ray.available_resources().get("CPU") == total_cpu:
            break
        time.sleep(0.2)
    assert set(states.values()) == {"DEAD"}, states
    assert ray.available_resources().get("CPU") == total_cpu


def test_a_label_selector_keeps_the_actors_on_the_labelled_node(ray_cluster: Cluster) -> None:
    """``runtime.label_selector`` (Ray node labels): both actors, and so every rollout, on
    the worker labelled ``tracerl-pool=agents``, none on the unlabelled head."""
    rt = _build(ray_cluster, "+runtime.label_selector={tracerl-pool: agents}")
    (worker,) = ray_cluster.worker_nodes

    async def body() -> list[Any]:
        assert {s.node_id for s in rt._slots} == {worker.node_id}
        return await asyncio.gather(
            *(rt.run_rollout(conformance_request({"mode": "ok", "reward": 0.5})) for _ in range(6))
        )

    results = _run(rt, body)
    assert [r.status for r in results] == [RolloutStatus.OK] * 6
    assert dict(rt.rollouts_per_node) == {worker.node_id: 6}


def test_a_killed_actor_fails_its_rollouts_and_is_recreated(ray_cluster: Cluster) -> None:
    """Killing an actor (its worker process) mid-rollout: its rollouts come back ``CRASHED``
    naming the actor, the other actor's rollouts are unaffected, and Ray recreates it."""
    rt = _build(ray_cluster)

    async def body() -> None:
        hung = [conformance_request({"mode": "ok", "sleep_s": 4.0, "reward": 1.0}) for _ in range(4)]
        tasks = [asyncio.create_task(rt.run_rollout(r)) for r in hung]
        await asyncio.sleep(1.5)
        ray.kill(rt.actors[0], no_restart=False)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        crashed = [r for r in results if r.status is RolloutStatus.CRASHED]
        ok = [r for r in results if r.status is RolloutStatus.OK]
        assert len(crashed) == 2 and len(ok) == 2, [(r.status, r.error) for r in results]
        assert all("agent actor 0" in (r.error or "") and r.reward is None for r in crashed)
        deadline = time.monotonic() + 60
        served = set()
        while len(served) < 2:
            assert time.monotonic() < deadline, "the killed actor never came back"
            again = await asyncio.gather(
                *(rt.run_rollout(conformance_request({"mode": "ok", "reward": 0.5})) for _ in range(4))
            )
            served |= {int(r.metrics["pid"]) for r in again if r.status is RolloutStatus.OK}
            await asyncio.sleep(0.2)

    _run(rt, body)


def test_a_loopback_gateway_is_refused_when_a_node_is_on_another_machine(
    ray_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All test nodes share this machine's IP, so a loopback gateway is accepted (every other
    test here starts with ``gateway.host=127.0.0.1``). Seen from a driver with another IP
    (faked: we have one machine), the same nodes are remote and the start is refused,
    leaving no actor behind."""
    rt = _build(ray_cluster, "gateway.public_host=127.0.0.1")
    assert rt.gateway_host == "127.0.0.1"
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.99.0.1")

    async def main() -> None:
        with pytest.raises(ConfigError, match=r"gateway.public_host.*other machines"):
            await rt.start()
        await rt.aclose()

    asyncio.run(main())
    assert agent_actor_states(f"{ACTOR_PREFIX}{rt.run_id}") == {}


def test_an_actor_that_fits_no_node_fails_the_start_with_a_message(ray_cluster: Cluster) -> None:
    """Asking for a resource no node has ends ``start`` at ``startup_timeout_s`` with the
    request and the cluster's free resources in the message, and no actor left pending."""
    rt = _build(ray_cluster, "+runtime.resources_per_agent.gpu_sandbox=1", "runtime.startup_timeout_s=3")

    async def main() -> None:
        with pytest.raises(Exception, match=r"not ready within.*gpu_sandbox"):
            await rt.start()

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while set(agent_actor_states(f"{ACTOR_PREFIX}{rt.run_id}").values()) - {"DEAD"}:
        assert time.monotonic() < deadline, agent_actor_states(f"{ACTOR_PREFIX}{rt.run_id}")
        time.sleep(0.2)


def test_the_toy_task_trains_through_runtime_ray(ray_cluster: Cluster, tmp_path: Path) -> None:
    """``python -m core.train runtime=ray`` (default task succ_digit, tiny model, local backend)
    joins the cluster as a second driver, trains three steps with every rollout ``ok``, puts
    its actors on both nodes (loopback gateway accepted: all nodes are this machine) and
    leaves none alive."""
    before = {a["ActorID"] for a in agent_actors(ACTOR_PREFIX)}
    cmd = [
        sys.executable, "-m", "core.train", "runtime=ray", f"runtime.address={ray_cluster.address}",
        "runtime.num_actors=2", "runtime.agents_per_actor=8", "runtime.num_cpus_per_agent=0.05",
        "trainer.max_steps=3", "trainer.batch_size=2", "trainer.group_size=4", "trainer.eval_size=1",
        "trainer.canary=false", "trainer.save_every=0", "trainer.progress=false",
        f"run_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollouts/total" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["rollouts/ok"] == r["rollouts/total"] == 8 for r in steps), steps
    assert all(r["train/num_tokens"] > 0 for r in steps)
    ran = [a for a in agent_actors(ACTOR_PREFIX) if a["ActorID"] not in before]
    assert len(ran) == 2, ran
    assert {a["State"] for a in ran} == {"DEAD"}, ran
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {a["Address"]["NodeID"] for a in ran} == nodes


AGENTS_DIR = Path(__file__).parents[2] / "agents"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def test_an_agentcore_rl_app_agent_runs_unchanged_with_results_in_s3(ray_cluster: Cluster) -> None:
    """agentcore-rl-toolkit 0.2.0's own ``AgentCoreRLApp`` (tests/runtime/agents/art_agent_original.py)
    under ``runtime=ray`` with ``result_channel=s3``: the agents write results to S3, the actors
    poll them. S3 is moto's server on 127.0.0.1, standing in for AWS we cannot reach; the
    actors get its credentials through ``runtime.runtime_env`` (Ray's ``env_vars``)."""
    with moto_s3_server("rollouts") as endpoint:
        rt = RayRuntime(
            "art_agent_original:app",
            address=ray_cluster.address,
            num_actors=2,
            agents_per_actor=4,
            num_cpus_per_agent=0.1,
            result_channel="s3",
            s3_bucket="rollouts",
            s3_endpoint_url=endpoint,
            s3_exp_id="ray-art",
            runtime_env={"env_vars": CREDS},
            env={"PYTHONPATH": str(AGENTS_DIR), "AWS_ENDPOINT_URL_S3": endpoint, **CREDS},
        )
        reqs = [conformance_request({"reward": i / 4, "sleep_s": 0.1}) for i in range(4)]
        bad = conformance_request({"mode": "raise", "reward": 0})

        async def body() -> list[Any]:
            return await asyncio.gather(*(rt.run_rollout(r) for r in [*reqs, bad]))

        results = _run(rt, body)
    for req, res in zip(reqs, results[:-1], strict=True):
        assert res.status is RolloutStatus.OK and res.reward == req.payload["reward"], res.error
    assert results[-1].status is RolloutStatus.CRASHED
    assert "toolkit agent failed on purpose" in (results[-1].error or "")
    assert len(rt.rollouts_per_node) == 2, rt.rollouts_per_node


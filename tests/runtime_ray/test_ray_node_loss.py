"""Losing a whole node mid-step under ``runtime=ray`` (marker ``ray``).

Its own three-node cluster (head and two workers): the test removes a worker
node (its raylet, object store and every worker process on it), so it cannot
share the module cluster of ``test_ray_runtime.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster
from ray_test_cluster import start_cluster, stop_cluster

from core.runtime.ray import RayRuntime
from core.testing import CONFORMANCE_AGENT
from core.testing.runtime_conformance import conformance_request
from core.types import RolloutStatus

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Cluster]:
    cluster = start_cluster(workers=2)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def test_killing_a_node_mid_step_fails_its_rollouts_and_the_run_continues(
    three_nodes: Cluster,
) -> None:
    """A worker node is killed while every actor has rollouts in flight: exactly the rollouts
    on that node come back ``CRASHED`` (naming the lost actor) within seconds, the others
    finish ``OK``, Ray recreates the lost actor on a surviving node, and the next step's
    rollouts all succeed."""
    rt = RayRuntime(
        CONFORMANCE_AGENT,
        address=three_nodes.address,
        num_actors=3,
        agents_per_actor=4,
        num_cpus_per_agent=0.1,
        gateway_host="127.0.0.1",
    )
    worker_ids = {n.node_id: n for n in three_nodes.worker_nodes}

    async def main() -> None:
        await rt.start()
        try:
            placed = {s.index: s.node_id for s in rt._slots}
            assert len(set(placed.values())) == 3, f"SPREAD put the 3 actors on {placed}"
            victim_index, victim_id = next((i, n) for i, n in placed.items() if n in worker_ids)
            step = [conformance_request({"mode": "ok", "sleep_s": 4.0, "reward": 1.0}) for _ in range(9)]
            tasks = [asyncio.create_task(rt.run_rollout(r)) for r in step]
            await asyncio.sleep(1.5)
            assert all(s.in_flight == 3 for s in rt._slots), [s.in_flight for s in rt._slots]
            t0 = time.monotonic()
            three_nodes.remove_node(worker_ids[victim_id], allow_graceful=False)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            took = time.monotonic() - t0
            crashed = [r for r in results if r.status is RolloutStatus.CRASHED]
            ok = [r for r in results if r.status is RolloutStatus.OK]
            assert len(crashed) == 3 and len(ok) == 6, [(r.status, r.error) for r in results]
            assert all(f"agent actor {victim_index}" in (r.error or "") for r in crashed), crashed[0].error
            assert all(r.reward is None for r in crashed) and all(r.reward == 1.0 for r in ok)
            assert took < 30, f"the lost node's rollouts took {took:.1f}s to fail"
            assert victim_id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}

            # The next step: all rollouts succeed, and the lost actor lives again elsewhere.
            deadline = time.monotonic() + 90
            while True:
                nxt = await asyncio.gather(
                    *(rt.run_rollout(conformance_request({"mode": "ok", "reward": 0.5})) for _ in range(6))
                )
                victim = rt._slots[victim_index]
                if all(r.status is RolloutStatus.OK for r in nxt) and victim.healthy:
                    break
                assert time.monotonic() < deadline, [(r.status, r.error) for r in nxt]
                await asyncio.sleep(0.5)
            assert victim.node_id and victim.node_id != victim_id
        finally:
            await rt.aclose()

    asyncio.run(main())

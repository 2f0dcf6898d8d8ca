"""Losing a whole node mid-step under ``runtime=ray`` (marker ``ray``).

Its own three-node cluster (head and two workers): the test removes a worker
node (its raylet, object store and every worker process on it), so it cannot
share the module cluster of ``test_ray_runtime.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from core.runtime.ray import RayRuntime
from core.testing import CONFORMANCE_AGENT
from core.testing.runtime_conformance import conformance_request
from core.types import RolloutStatus
from tests.faults.harness import (
    LoopSpy,
    assert_metrics_match,
    assert_trained_only_ok,
    fault_overrides,
    hook_sampler,
    run_loop,
    statuses,
    step_records,
)
from tests.runtime.ray.cluster.ray_test_cluster import NODE_ARGS, start_cluster, stop_cluster

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Cluster]:
    cluster = start_cluster(workers=2)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _top_up(cluster: Cluster, workers: int) -> None:
    """Add worker nodes until ``workers`` are alive, whichever tests ran before."""
    while len(cluster.worker_nodes) < workers:
        cluster.add_node(**NODE_ARGS)
    cluster.wait_for_nodes()
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == workers + 1, f"expected the head and {workers} workers, got {len(alive)} nodes"


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
    _top_up(three_nodes, workers=2)
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
            # The GCS marks the node dead when its heartbeats stop, which can come after
            # the rollouts have failed (the actor's connection breaks first).
            gone_by = time.monotonic() + 60
            while victim_id in {n["NodeID"] for n in ray.nodes() if n["Alive"]}:
                assert time.monotonic() < gone_by, "the GCS never marked the removed node dead"
                await asyncio.sleep(0.5)

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


def test_a_training_run_goes_on_when_a_node_dies_mid_step(
    three_nodes: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training loop (``core.trainer.loop.Trainer``, fake backend, real gateway) on
    ``runtime=ray`` with three actors on three nodes. In step 2, while every rollout waits
    inside a model call, a worker node hosting an actor is removed: that actor's rollouts
    are ``crashed`` (and not trained on), the others ``ok``; step 3 runs in full and the
    run ends normally."""
    from core.plugins import load_plugins
    from core.testing.fakes import compose, fake_backend_plugin

    _top_up(three_nodes, workers=2)  # the previous test (if it ran) removed one worker
    spy = LoopSpy().install(monkeypatch)
    killed = asyncio.Event()
    victim: dict[str, object] = {}

    async def kill(slot: Any, node: Any) -> None:
        await asyncio.sleep(1.5)  # every rollout of the step reaches its model call
        victim["in_flight"] = slot.in_flight
        await asyncio.to_thread(three_nodes.remove_node, node, False)
        # Hold the model's replies a while: the lost node's actor process notices its raylet
        # is gone within a second or so; a reply before that would let its rollouts finish.
        await asyncio.sleep(4.0)
        killed.set()

    async def kill_a_node_during_step_2(prompt: Sequence[int], session_id: str) -> None:
        if spy.current_step != 2 or killed.is_set():
            return
        if not victim:
            # The killer runs as its own task: this call may be one of the victim's, which the
            # gateway cancels once its rollout has failed.
            rt = spy.trainer.runtime if spy.trainer is not None else None
            workers = {n.node_id: n for n in three_nodes.worker_nodes}
            slot = next(s for s in rt._slots if s.node_id in workers)
            victim.update(index=slot.index, node=slot.node_id)
            victim["task"] = asyncio.create_task(kill(slot, workers[slot.node_id]))
        await killed.wait()

    hook_sampler(monkeypatch, kill_a_node_during_step_2)
    overrides = [o for o in fault_overrides(tmp_path) if not o.startswith("runtime.")]
    overrides += [
        "runtime=ray",
        f"runtime.address={three_nodes.address}",
        "runtime.num_actors=3",
        "runtime.agents_per_actor=4",
        "runtime.num_cpus_per_agent=0.1",
        "trainer.group_size=4",
        "trainer.max_failure_rate=0.75",
    ]
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    cfg = compose(overrides, plugins)
    code, backend = run_loop(cfg, plugins)
    assert code == 0 and victim and killed.is_set(), "the run went on to its end"

    step2 = spy.step(2).outcomes
    crashed = [o for o in step2 if o.result.status is RolloutStatus.CRASHED]
    assert 1 <= len(crashed) == victim["in_flight"] < len(step2), (victim, statuses(step2))
    assert all(f"agent actor {victim['index']}" in (o.result.error or "") for o in crashed)
    assert all(o.result.status is RolloutStatus.OK for o in step2 if o not in crashed), statuses(step2)
    assert [o.result.status for o in spy.step(3).outcomes] == [RolloutStatus.OK] * 8
    records = step_records(Path(cfg.run_dir))
    assert sorted(records) == [1, 2, 3]
    for n in (1, 2, 3):
        assert_metrics_match(records[n], spy.step(n).outcomes)
    assert records[2]["rollouts/crashed"] == len(crashed)
    assert_trained_only_ok(spy, backend)

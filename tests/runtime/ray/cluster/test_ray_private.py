"""``runtime.address`` empty: the runtime starts a private single-node Ray and ``aclose``
stops it (marker ``ray``). No cluster fixture: this module's driver must not be connected."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from core.runtime.ray import RayRuntime
from core.testing import CONFORMANCE_AGENT
from core.testing.runtime_conformance import conformance_request
from core.types import RolloutStatus
from tests.runtime.ray.cluster.ray_test_cluster import alive

pytestmark = pytest.mark.ray


def test_an_empty_address_starts_a_private_ray_that_aclose_stops() -> None:
    assert not ray.is_initialized()
    rt = RayRuntime(
        CONFORMANCE_AGENT, num_actors=1, agents_per_actor=2, num_cpus=1, object_store_memory_mb=80
    )
    pids: list[int] = []

    async def main() -> None:
        await rt.start()
        try:
            assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 1.0
            node = ray._private.worker._global_node
            pids.extend(i.process.pid for infos in node.all_processes.values() for i in infos if i.process)
            result = await rt.run_rollout(conformance_request({"mode": "ok", "reward": 0.5}))
            assert result.status is RolloutStatus.OK and result.reward == 0.5, result.error
        finally:
            await rt.aclose()

    asyncio.run(main())
    assert not ray.is_initialized()
    assert pids
    deadline = time.monotonic() + 15
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"the private Ray left processes running: {left}"

"""``runtime=ray``'s driver-side dispatch and recovery, without a cluster (main suite, no ray).

The real ``RayRuntime`` code (``run_rollout``, its per-actor places, ``_probe``) runs
against fake actor handles: ``handle.method.remote(...)`` returns an awaitable as a Ray
``ObjectRef`` does, and ``ready`` fails the way a recreating actor does. The fakes stand
in for the Ray cluster at the actor-call edge; the cluster itself is tested under marker
``ray`` (``tests/runtime/ray/cluster``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from core.runtime.ray import RayRuntime
from core.runtime.ray import runtime as ray_runtime
from core.runtime.ray.runtime import _Slot
from core.testing import CONFORMANCE_AGENT
from core.testing.runtime_conformance import conformance_request
from core.types import RolloutResult, RolloutStatus


class _RayError(Exception):
    """Stands in for ``ray.exceptions.RayError`` (this test imports no ray)."""


class _ActorDiedError(_RayError):
    """Stands in for ``ray.exceptions.ActorDiedError``."""


FAKE_RAY = SimpleNamespace(
    exceptions=SimpleNamespace(
        RayError=_RayError,
        ActorDiedError=_ActorDiedError,
        RayActorError=_ActorDiedError,
        TaskCancelledError=type("TaskCancelledError", (_RayError,), {}),
        RayTaskError=type("RayTaskError", (_RayError,), {}),
    ),
    get_actor=lambda name, namespace: object(),
    cancel=lambda ref: None,
)


class _Method:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        return self._fn(*args)


class FakeActor:
    """An actor handle: ``run`` holds each rollout until ``release`` is set."""

    def __init__(self, name: str, release: asyncio.Event, ready_failures: int = 0) -> None:
        self.name = name
        self.release = release
        self.running = 0
        self.most_running = 0
        self.ran = 0
        self.ready_calls = 0
        self.ready_failures = ready_failures
        self.run = _Method(self._run)
        self.ready = _Method(self._ready)
        self.cancel = _Method(self._cancel)

    async def _run(self, request: Any) -> tuple[RolloutResult, str]:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        self.ran += 1
        return RolloutResult(request.rollout_id, RolloutStatus.OK, reward=1.0), self.name

    async def _ready(self) -> dict[str, Any]:
        self.ready_calls += 1
        if self.ready_calls <= self.ready_failures:
            await asyncio.sleep(10)  # still being recreated: the probe's timeout fires
        return {"node_id": f"node-of-{self.name}"}

    async def _cancel(self, rollout_id: str) -> None:
        return None


def _runtime(actors: list[FakeActor], **settings: Any) -> RayRuntime:
    rt = RayRuntime(CONFORMANCE_AGENT, num_actors=len(actors), **settings)
    rt._ray = FAKE_RAY
    rt._slots = [_Slot(i, a.name, a, node_id=f"node-of-{a.name}") for i, a in enumerate(actors)]
    rt._started = True
    return rt


def test_rollouts_wait_for_room_on_a_healthy_actor_instead_of_piling_onto_it() -> None:
    """Two actors of 4 places, one being recreated: 8 rollouts put 4 on the survivor and the
    other 4 wait (not 8 on an actor sized for 4); when the other actor is back, they go there."""

    async def main() -> None:
        release = asyncio.Event()
        a, b = FakeActor("a", release), FakeActor("b", release)
        rt = _runtime([a, b], agents_per_actor=4)
        rt._slots[0].healthy = False
        tasks = [asyncio.create_task(rt.run_rollout(conformance_request({}))) for _ in range(8)]
        await asyncio.sleep(0.05)
        assert (a.running, b.running) == (0, 4), "the survivor holds only its own 4 places"
        assert sum(not t.done() for t in tasks) == 8

        rt._slots[0].healthy = True  # what _probe does when the actor answers again
        await rt._health_changed()
        await asyncio.sleep(0.05)
        assert (a.running, b.running) == (4, 4)
        release.set()
        results = await asyncio.gather(*tasks)
        assert [r.status for r in results] == [RolloutStatus.OK] * 8
        assert rt.rollouts_per_node == Counter({"a": 4, "b": 4})
        assert max(a.most_running, b.most_running) == 4
        assert all(s.in_flight == 0 for s in rt._slots)

    asyncio.run(main())


def test_a_freed_place_is_taken_by_a_waiting_rollout() -> None:
    async def main() -> None:
        release = asyncio.Event()
        only = FakeActor("only", release)
        rt = _runtime([only], agents_per_actor=2)
        results = await asyncio.gather(
            *(rt.run_rollout(conformance_request({})) for _ in range(5)),
            _set_later(release, 0.05),
        )
        assert [r.status for r in results[:5]] == [RolloutStatus.OK] * 5
        assert only.most_running == 2 and only.ran == 5

    asyncio.run(main())


async def _set_later(event: asyncio.Event, delay: float) -> None:
    await asyncio.sleep(delay)
    event.set()


def test_waiting_rollouts_fail_when_the_last_actor_is_dead() -> None:
    async def main() -> None:
        release = asyncio.Event()
        only = FakeActor("only", release)
        rt = _runtime([only], agents_per_actor=1)
        first = asyncio.create_task(rt.run_rollout(conformance_request({})))
        waiting = asyncio.create_task(rt.run_rollout(conformance_request({})))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        rt._slots[0].dead = True  # what _probe does once Ray has dropped the actor
        await rt._health_changed()
        result = await asyncio.wait_for(waiting, 5)
        assert result.status is RolloutStatus.CRASHED and "no agent actor is left" in (result.error or "")
        release.set()
        assert (await first).status is RolloutStatus.OK

    asyncio.run(main())


def test_an_actor_that_comes_back_after_the_startup_window_is_used_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The actor answers ``ready`` only after many times ``startup_timeout_s`` (a node that
    took long to join): the probe keeps asking (with backoff) and the actor is healthy again,
    and a rollout goes there."""
    monkeypatch.setattr(ray_runtime, "PROBE_FIRST_S", 0.01)
    monkeypatch.setattr(ray_runtime, "PROBE_MAX_S", 0.02)

    async def main() -> None:
        release = asyncio.Event()
        release.set()
        late = FakeActor("late", release, ready_failures=8)
        rt = _runtime([late], startup_timeout_s=0.03)
        slot = rt._slots[0]
        slot.healthy = False
        rt._watch(slot)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while not slot.healthy and loop.time() - t0 < 5:
            await asyncio.sleep(0.02)
        took = loop.time() - t0
        assert slot.healthy, f"still unhealthy after {late.ready_calls} probes"
        assert late.ready_calls == 9 and took > 3 * rt.config.startup_timeout_s
        result = await rt.run_rollout(conformance_request({}))
        assert result.status is RolloutStatus.OK and rt.rollouts_per_node["late"] == 1

    asyncio.run(main())


def test_probing_stops_at_aclose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_runtime, "PROBE_FIRST_S", 0.01)

    async def main() -> None:
        never = FakeActor("never", asyncio.Event(), ready_failures=10**6)
        rt = _runtime([never], startup_timeout_s=0.02)
        rt._slots[0].healthy = False
        rt._watch(rt._slots[0])
        await asyncio.sleep(0.1)
        assert len(rt._background) == 1
        rt._closed = True
        rt._ray = None  # nothing to shut down: the fakes have no cluster
        await rt._shutdown()
        await asyncio.sleep(0.05)
        assert not rt._background

    asyncio.run(main())


def test_a_reserved_place_is_where_the_rollout_runs_and_only_on_accepted_nodes() -> None:
    """``reserve`` (``gateway.shards=per_node`` opens the session on the node first) takes a
    place on an accepted node only, waits for room there, and the rollout then runs on that
    actor; ``unreserve`` gives a place back; with no accepted node left it answers None."""

    async def main() -> None:
        release = asyncio.Event()
        a, b = FakeActor("a", release), FakeActor("b", release)
        rt = _runtime([a, b], agents_per_actor=2)
        accepted = {"node-of-b"}

        def where(node: str) -> bool:
            return node in accepted

        assert await rt.reserve("r1", where) == "node-of-b"
        assert await rt.reserve("r2", where) == "node-of-b"
        third = asyncio.create_task(rt.reserve("r3", where))
        await asyncio.sleep(0.05)
        assert not third.done(), "b is full and a's node is not accepted: it waits"
        await rt.unreserve("r2")  # r2 will not run: its place goes to the waiting one
        assert await asyncio.wait_for(third, 5) == "node-of-b"
        await rt.unreserve("r2")  # idempotent
        tasks = [asyncio.create_task(rt.run_rollout(conformance_request({}))) for _ in range(2)]
        runs = [
            asyncio.create_task(rt.run_rollout(dataclasses.replace(conformance_request({}), rollout_id=rid)))
            for rid in ("r1", "r3")
        ]
        await asyncio.sleep(0.05)
        assert (a.running, b.running) == (2, 2), "r1 and r3 on b, the unreserved rollouts on a"
        release.set()
        assert all(r.status is RolloutStatus.OK for r in await asyncio.gather(*tasks, *runs))
        assert all(s.in_flight == 0 for s in rt._slots)

        assert [await rt.reserve(r, where) for r in ("r4", "r5")] == ["node-of-b"] * 2
        waiting = asyncio.create_task(rt.reserve("r6", where))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        accepted.clear()  # b's shard died: the waiting rollout has nowhere to go
        await rt.placement_changed()
        assert await asyncio.wait_for(waiting, 5) is None

    asyncio.run(main())


def test_a_rollout_waits_for_a_node_whose_shard_is_starting() -> None:
    """With no accepted node, ``reserve`` answers None at once, unless a live actor is on a
    node ``wait_for`` names (its gateway shard is starting): then it waits, and takes a place
    there once the node is accepted, or answers None once the start failed."""

    async def main() -> None:
        a = FakeActor("a", asyncio.Event())
        rt = _runtime([a], agents_per_actor=2)
        accepted: set[str] = set()
        starting = {"node-of-a"}

        def where(node: str) -> bool:
            return node in accepted

        def wait_for(node: str) -> bool:
            return node in starting

        assert await rt.reserve("r0", where) is None, "nothing accepted and nothing awaited"
        first = asyncio.create_task(rt.reserve("r1", where, wait_for=wait_for))
        await asyncio.sleep(0.05)
        assert not first.done(), "a's node has a shard starting: the rollout waits for it"
        starting.clear()
        accepted.add("node-of-a")
        await rt.placement_changed()
        assert await asyncio.wait_for(first, 5) == "node-of-a"
        await rt.unreserve("r1")

        accepted.clear()
        starting.add("node-of-a")
        second = asyncio.create_task(rt.reserve("r2", where, wait_for=wait_for))
        await asyncio.sleep(0.05)
        assert not second.done()
        starting.clear()  # the start failed
        await rt.placement_changed()
        assert await asyncio.wait_for(second, 5) is None

    asyncio.run(main())

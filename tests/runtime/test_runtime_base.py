"""``RuntimeBase``'s lifecycle and cancellation contract, on a runtime with no processes.

The built-in runtimes run the same contract against real agents
(``RuntimeConformance`` in ``local/``, ``agentcore/`` and ``ray/cluster/``);
here each clause is checked alone, fast.
"""

from __future__ import annotations

import asyncio

import pytest

from core.errors import RuntimeStartError
from core.runtime.base import RolloutClock, RuntimeBase
from core.testing.runtime_conformance import conformance_request
from core.types import RolloutRequest, RolloutResult, RolloutStatus


class _Runtime(RuntimeBase):
    """Each rollout waits for ``release``, then answers OK with reward 1."""

    kind = "test"

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.starts = 0
        self.shutdowns = 0
        self.settle_after_run = False

    async def _start(self) -> None:
        self.starts += 1

    async def _run(self, request: RolloutRequest, clock: RolloutClock) -> RolloutResult:
        await self.release.wait()
        if self.settle_after_run:
            self._settled(request.rollout_id)
            await asyncio.sleep(0.05)  # cleanup that awaits (agentcore stops its session)
        return RolloutResult(request.rollout_id, RolloutStatus.OK, reward=1.0, elapsed_s=clock.elapsed())

    async def _shutdown(self) -> None:
        self.shutdowns += 1


def test_refused_before_start_and_after_close_start_once_close_once() -> None:
    async def main() -> None:
        rt = _Runtime()
        early = await rt.run_rollout(conformance_request({}))
        assert early.status is RolloutStatus.REJECTED and "not started" in (early.error or "")
        await rt.start()
        await rt.start()
        assert rt.starts == 1
        await rt.aclose()
        await rt.aclose()
        assert rt.shutdowns == 1
        late = await rt.run_rollout(conformance_request({}))
        assert late.status is RolloutStatus.REJECTED and "test runtime is closed" in (late.error or "")
        with pytest.raises(RuntimeStartError, match="was closed"):
            await rt.start()

    asyncio.run(main())


def test_cancel_answers_with_a_result_and_uncancels_the_task() -> None:
    async def main() -> None:
        rt = _Runtime()
        await rt.start()
        request = conformance_request({})
        seen: list[int] = []

        async def caller() -> RolloutResult:
            result = await rt.run_rollout(request)
            task = asyncio.current_task()
            assert task is not None
            seen.append(task.cancelling())
            return result

        task = asyncio.create_task(caller())
        await asyncio.sleep(0.01)
        await rt.cancel("no-such-rollout")  # ignored
        await rt.cancel(request.rollout_id)
        result = await task
        assert result.status is RolloutStatus.CRASHED and result.error == "cancelled by the trainer"
        assert result.reward is None and seen == [0]
        rt.release.set()
        again = await rt.run_rollout(conformance_request({}))
        assert again.status is RolloutStatus.OK
        await rt.aclose()

    asyncio.run(main())


def test_a_cancellation_that_is_not_ours_propagates() -> None:
    async def main() -> None:
        rt = _Runtime()
        await rt.start()
        task = asyncio.create_task(rt.run_rollout(conformance_request({})))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not rt._tasks and not rt._cancelled
        await rt.aclose()

    asyncio.run(main())


class _CleaningRuntime(_Runtime):
    """Cleans up for a while after our cancel (as local cancels the invocation remotely)."""

    async def _run(self, request: RolloutRequest, clock: RolloutClock) -> RolloutResult:
        try:
            return await super()._run(request, clock)
        except asyncio.CancelledError:
            if self._cancelled_by_us(request.rollout_id):
                await asyncio.sleep(0.2)
            raise


def test_a_cancellation_during_the_cleanup_after_ours_propagates() -> None:
    async def main() -> None:
        rt = _CleaningRuntime()
        await rt.start()
        request = conformance_request({})
        task = asyncio.create_task(rt.run_rollout(request))
        await asyncio.sleep(0.01)
        await rt.cancel(request.rollout_id)
        await asyncio.sleep(0.05)  # cleaning up after our cancel
        task.cancel()  # the caller's own
        with pytest.raises(asyncio.CancelledError):
            await task
        alone = asyncio.create_task(rt.run_rollout(conformance_request({})))
        await asyncio.sleep(0.01)
        await rt.aclose()
        assert (await alone).status is RolloutStatus.CRASHED

    asyncio.run(main())


def test_aclose_ends_rollouts_in_flight_as_cancelled_results() -> None:
    async def main() -> None:
        rt = _Runtime()
        await rt.start()
        tasks = [asyncio.create_task(rt.run_rollout(conformance_request({}))) for _ in range(3)]
        await asyncio.sleep(0.01)
        await rt.aclose()
        results = await asyncio.gather(*tasks)
        assert [r.status for r in results] == [RolloutStatus.CRASHED] * 3
        assert rt.shutdowns == 1

    asyncio.run(main())


def test_a_settled_rollout_ignores_a_late_cancel() -> None:
    async def main() -> None:
        rt = _Runtime()
        rt.settle_after_run = True
        await rt.start()
        request = conformance_request({})
        task = asyncio.create_task(rt.run_rollout(request))
        await asyncio.sleep(0.01)
        rt.release.set()
        await asyncio.sleep(0.01)  # settled, its cleanup still running
        await rt.cancel(request.rollout_id)
        result = await task
        assert result.status is RolloutStatus.OK and result.reward == 1.0
        await rt.aclose()

    asyncio.run(main())

"""Conformance suite every rollout runtime runs (in-tree and third-party alike).

It checks the fault contract of ``core.interfaces.RolloutRuntime``: agent
faults come back as failed ``RolloutResult``s, never as exceptions, and the
runtime keeps serving afterwards. Usage, in the runtime's own tests::

    import pytest
    from core.testing import CONFORMANCE_AGENT, RuntimeConformance

    class TestMyRuntimeConformance(RuntimeConformance):
        @pytest.fixture
        def runtime(self):
            # not started: each test starts it and closes it
            return MyRuntime(agent=CONFORMANCE_AGENT, workers=1)

The runtime must serve ``core.testing.conformance_agent:app`` (``CONFORMANCE_AGENT``),
whose payload picks a behaviour (``ok``, ``raise``, ``hang``, ``die``,
``bad_reward``, ``no_reward``); it never calls the model, so no gateway runs.
Each test starts the runtime, runs its body in one ``asyncio.run`` and closes
it, so tests are independent (and start a runtime each: four starts in all).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from core.interfaces import RolloutRuntime
from core.testing.conformance_agent import CONFORMANCE_AGENT
from core.types import RolloutRequest, RolloutResult, RolloutStatus

__all__ = ["CONFORMANCE_AGENT", "RuntimeConformance", "conformance_request"]


def conformance_request(payload: dict[str, Any], *, timeout_s: float = 30.0) -> RolloutRequest:
    """A rollout request for the conformance agent (fresh ids; the gateway URL is never used)."""
    return RolloutRequest(
        rollout_id=f"conf-{uuid.uuid4().hex[:12]}",
        group_id="conformance",
        payload=payload,
        base_url="http://127.0.0.1:9/v1",
        session_id=f"conf-sess-{uuid.uuid4().hex}",
        model_id="conformance",
        sampling_params={"max_tokens": 8},
        timeout_s=timeout_s,
    )


class RuntimeConformance:
    """Mixin of tests; subclasses provide a ``runtime`` fixture (not started)."""

    hang_timeout_s: float = 1.0
    """``timeout_s`` given to the hanging rollout; the result must come back soon after."""
    slack_s: float = 10.0
    """How much later than its deadline a timed-out or cancelled rollout may return."""
    recover_within_s: float = 60.0
    """How long the runtime may take to serve again after an agent process died."""

    @pytest.fixture
    def runtime(self) -> RolloutRuntime:  # pragma: no cover - subclasses override
        raise NotImplementedError("subclass RuntimeConformance and define a `runtime` fixture")

    @staticmethod
    def run(runtime: RolloutRuntime, body: Callable[[], Awaitable[Any]]) -> Any:
        """Start ``runtime``, await ``body()``, close the runtime whatever happened."""

        async def _main() -> Any:
            await runtime.start()
            try:
                return await body()
            finally:
                await runtime.aclose()

        return asyncio.run(_main())

    @staticmethod
    def assert_failed(result: RolloutResult, request: RolloutRequest, *statuses: RolloutStatus) -> None:
        """A failed result for ``request``: one of ``statuses``, no reward, an error text."""
        assert isinstance(result, RolloutResult), f"run_rollout returned {result!r}"
        assert result.rollout_id == request.rollout_id
        assert result.status in statuses, f"{result.status} not in {statuses}: {result.error}"
        assert result.reward is None, f"a failed rollout carries no reward, got {result.reward!r}"
        assert result.error, "a failed rollout says why in `error`"

    # -- tests ----------------------------------------------------------------------

    def test_rewards_and_agent_faults_are_results(self, runtime: RolloutRuntime) -> None:
        """``ok`` carries its reward; a raising agent or a bad or missing reward is a failed result."""

        async def body() -> None:
            ok = conformance_request({"mode": "ok", "reward": 0.75})
            raised = conformance_request({"mode": "raise", "tag": "T42"})
            text = conformance_request({"mode": "bad_reward", "value": "1.0"})
            nan = conformance_request({"mode": "bad_reward", "value": float("nan")})
            missing = conformance_request({"mode": "no_reward"})
            results = await asyncio.gather(
                *(runtime.run_rollout(r) for r in (ok, raised, text, nan, missing))
            )
            good = results[0]
            assert good.rollout_id == ok.rollout_id
            assert good.status is RolloutStatus.OK and good.reward == 0.75, good.error
            assert good.elapsed_s >= 0.0
            self.assert_failed(results[1], raised, RolloutStatus.CRASHED)
            assert "T42" in (results[1].error or ""), "the agent's error reaches `error`"
            self.assert_failed(results[2], text, RolloutStatus.INVALID_REWARD)
            self.assert_failed(results[3], nan, RolloutStatus.INVALID_REWARD)
            self.assert_failed(results[4], missing, RolloutStatus.NO_REWARD)

        self.run(runtime, body)

    def test_hang_times_out_and_cancel_stops_a_rollout(self, runtime: RolloutRuntime) -> None:
        """A hung agent is cut off at ``timeout_s``; ``cancel`` ends another; both free the runtime."""

        async def body() -> None:
            hung = conformance_request({"mode": "hang"}, timeout_s=self.hang_timeout_s)
            t0 = time.monotonic()
            result = await runtime.run_rollout(hung)
            waited = time.monotonic() - t0
            self.assert_failed(result, hung, RolloutStatus.TIMEOUT)
            assert waited < self.hang_timeout_s + self.slack_s, f"timed out after {waited:.1f}s"

            victim = conformance_request({"mode": "hang"}, timeout_s=600.0)
            task = asyncio.create_task(runtime.run_rollout(victim))
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            await runtime.cancel(victim.rollout_id)
            cancelled = await asyncio.wait_for(task, self.slack_s)
            assert time.monotonic() - t0 < self.slack_s
            assert cancelled.status.failed and cancelled.reward is None
            await runtime.cancel("conf-no-such-rollout")  # unknown ids are ignored

            after = conformance_request({"mode": "ok", "reward": 0.5})
            again = await runtime.run_rollout(after)
            assert again.status is RolloutStatus.OK and again.reward == 0.5, again.error

        self.run(runtime, body)

    def test_dead_agent_is_a_failed_result_and_the_runtime_recovers(
        self, runtime: RolloutRuntime
    ) -> None:
        """An agent process that dies mid-rollout is ``CRASHED``; later rollouts succeed again."""

        async def body() -> None:
            dying = conformance_request({"mode": "die"})
            self.assert_failed(await runtime.run_rollout(dying), dying, RolloutStatus.CRASHED)
            deadline = time.monotonic() + self.recover_within_s
            while True:
                result = await runtime.run_rollout(conformance_request({"mode": "ok", "reward": 0.25}))
                if result.status is RolloutStatus.OK:
                    assert result.reward == 0.25
                    return
                assert time.monotonic() < deadline, f"still failing: {result.status}: {result.error}"
                await asyncio.sleep(0.2)

        self.run(runtime, body)

    def test_aclose_ends_rollouts_in_flight_and_is_idempotent(self, runtime: RolloutRuntime) -> None:
        """``aclose`` stops a hung rollout (failed result or cancellation), twice is harmless,
        and a rollout asked for afterwards is refused as a result, not an exception."""

        async def main() -> None:
            await runtime.start()
            hung = conformance_request({"mode": "hang"}, timeout_s=600.0)
            task = asyncio.create_task(runtime.run_rollout(hung))
            await asyncio.sleep(0.5)
            await asyncio.wait_for(runtime.aclose(), self.slack_s)
            try:
                result = await asyncio.wait_for(task, self.slack_s)
            except asyncio.CancelledError:
                pass  # cancelling the caller's task is a way to end it too
            else:
                self.assert_failed(result, hung, *RolloutStatus)
            await runtime.aclose()
            late = conformance_request({"mode": "ok"})
            refused = await runtime.run_rollout(late)
            self.assert_failed(refused, late, *RolloutStatus)

        asyncio.run(main())

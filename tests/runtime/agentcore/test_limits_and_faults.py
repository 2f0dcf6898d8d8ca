"""TPS limiting, throttling, cold starts, timeouts and cancellation through real boto3.

The data plane is the stand-in (AWS cannot be reached from CI). Where the
agent's isolation does not matter the stand-in serves an in-process
``AgentApp``, so hundreds of sessions cost no processes; the timeout test uses
one real process per session to show the stop kills the agent.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from acr_helpers import agent_env, make_request, make_runtime

from core.agent import AgentApp, ModelConfig
from core.runtime.agentcore import AgentCoreRuntime, runtime_session_id
from core.testing.agentcore_standin import AcrStandIn, StandInServer
from core.types import RolloutRequest, RolloutResult, RolloutStatus

pytestmark = pytest.mark.integration


def _agent() -> AgentApp:
    app = AgentApp()

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        if payload.get("mode") == "hang":
            await asyncio.sleep(3600)
        cfg = ModelConfig.from_payload(payload)
        return {"reward": float(payload.get("reward", 1.0)), "metrics": {"key_is_session": float(cfg.api_key == payload["expect_key"])}}

    return app


async def _run_all(runtime: AgentCoreRuntime, requests: list[RolloutRequest]) -> list[RolloutResult]:
    await runtime.start()
    try:
        return list(await asyncio.gather(*(runtime.run_rollout(r) for r in requests)))
    finally:
        await runtime.aclose()


@pytest.mark.slow
def test_tps_limiter_holds_the_rate_within_ten_percent() -> None:
    """50 rollouts = 150 data-plane calls (start, get, stop) at the default 25 TPS: 6 s saturated.

    The stand-in enforces the same 25 TPS the way AgentCore would (429 above
    it), so the limiter must also never let a burst through.
    """
    limit = 25.0
    standin = AcrStandIn(app=_agent(), tps_limit=limit)
    requests = [make_request({"reward": 1.0}) for _ in range(50)]
    with StandInServer(standin) as server:
        runtime = make_runtime(server.url, tps_limit=limit)
        results = asyncio.run(_run_all(runtime, requests))
    assert all(r.status is RolloutStatus.OK for r in results), [r.error for r in results]
    calls = standin.calls
    assert len(calls) == 150
    assert not [c for c in calls if c.status == 429], "the limiter let a burst through"
    times = sorted(c.t for c in calls)
    span = times[-1] - times[0]
    rate = (len(times) - 1) / span
    print(f"measured {rate:.2f} calls/s over {span:.2f}s at tps_limit={limit:g}")
    assert span > 5.0
    assert abs(rate - limit) <= 0.1 * limit, rate
    # No one-second window holds more than the limit allows (+10%).
    busiest = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert busiest <= 1.1 * limit, busiest


def test_throttling_for_a_while_loses_no_rollout() -> None:
    standin = AcrStandIn(app=_agent())
    standin.throttle_for(1.5)
    requests = [make_request({"reward": 0.5}) for _ in range(8)]
    with StandInServer(standin) as server:
        runtime = make_runtime(server.url, tps_limit=50.0)
        t0 = time.monotonic()
        results = asyncio.run(_run_all(runtime, requests))
        elapsed = time.monotonic() - t0
        stats = runtime.stats()
    assert [r.status for r in results] == [RolloutStatus.OK] * 8, [r.error for r in results]
    assert all(r.reward == 0.5 and r.metrics["key_is_session"] == 1.0 for r in results)
    throttled = [c for c in standin.calls if c.status == 429]
    assert len(throttled) >= 8 and stats["acr/throttled"] == len(throttled)
    assert elapsed >= 1.5
    assert sorted(standin.stopped_sessions()) == sorted(runtime_session_id(r) for r in requests)


def test_throttled_for_good_is_rejected_not_hung() -> None:
    standin = AcrStandIn(app=_agent())
    standin.throttle_for(3600)
    with StandInServer(standin) as server:
        runtime = make_runtime(server.url, stop_timeout_s=0.5)
        t0 = time.monotonic()
        (result,) = asyncio.run(_run_all(runtime, [make_request(timeout_s=2.0)]))
        elapsed = time.monotonic() - t0
    assert result.status is RolloutStatus.REJECTED
    assert "throttled" in (result.error or "") and "tps_limit" in (result.error or "")
    assert elapsed < 6.0


def test_cold_start_errors_are_retried_a_bounded_number_of_times() -> None:
    warm = AcrStandIn(app=_agent(), cold_start_failures=2)
    cold = AcrStandIn(app=_agent(), cold_start_failures=10)
    with StandInServer(warm) as s1, StandInServer(cold) as s2:
        ok_runtime = make_runtime(s1.url, cold_start_retries=3)
        ok = asyncio.run(_run_all(ok_runtime, [make_request() for _ in range(3)]))
        bad_runtime = make_runtime(s2.url, cold_start_retries=3)
        bad_request = make_request()
        (bad,) = asyncio.run(_run_all(bad_runtime, [bad_request]))
    assert [r.status for r in ok] == [RolloutStatus.OK] * 3, [r.error for r in ok]
    assert ok_runtime.stats()["acr/cold_start"] == 6
    assert bad.status is RolloutStatus.CRASHED
    assert "RuntimeClientError" in (bad.error or "") and "not serving" in (bad.error or "")
    assert sum(1 for c in cold.calls if c.op == "invoke") == 4  # first try + 3 retries
    assert cold.stopped_sessions() == [runtime_session_id(bad_request)]


@pytest.mark.slow
def test_timeout_stops_the_session_and_kills_its_agent(tmp_path: Path) -> None:
    standin = AcrStandIn(agent="acr_test_agents:app", env=agent_env(), workdir=tmp_path)
    request = make_request({"mode": "hang"}, timeout_s=4.0)
    with StandInServer(standin) as server:
        runtime = make_runtime(server.url)
        (result,) = asyncio.run(_run_all(runtime, [request]))
    assert result.status is RolloutStatus.TIMEOUT, result.error
    assert 4.0 <= result.elapsed_s < 8.0
    assert standin.stopped_sessions() == [runtime_session_id(request)]
    pid_files = list(tmp_path.glob("sessions/*/pid"))
    assert len(pid_files) == 1
    pid = int(pid_files[0].read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_cancel_returns_a_failed_result_and_stops_the_session() -> None:
    standin = AcrStandIn(app=_agent())
    request = make_request({"mode": "hang"})

    async def main(runtime: AgentCoreRuntime) -> RolloutResult:
        await runtime.start()
        try:
            task = asyncio.create_task(runtime.run_rollout(request))
            while not standin.accepted("invoke"):
                await asyncio.sleep(0.02)
            await runtime.cancel(request.rollout_id)
            return await task
        finally:
            await runtime.aclose()

    with StandInServer(standin) as server:
        result = asyncio.run(main(make_runtime(server.url)))
    assert result.status is RolloutStatus.CRASHED and "cancelled" in (result.error or "")
    assert standin.stopped_sessions() == [runtime_session_id(request)]


def test_aclose_stops_sessions_in_flight() -> None:
    standin = AcrStandIn(app=_agent())
    requests = [make_request({"mode": "hang"}) for _ in range(3)]

    async def main(runtime: AgentCoreRuntime) -> list[RolloutResult]:
        await runtime.start()
        tasks = [asyncio.create_task(runtime.run_rollout(r)) for r in requests]
        while len(standin.accepted("invoke")) < 3:
            await asyncio.sleep(0.02)
        await runtime.aclose()
        return list(await asyncio.gather(*tasks))

    with StandInServer(standin) as server:
        results = asyncio.run(main(make_runtime(server.url)))
    assert all(r.status is RolloutStatus.CRASHED for r in results)
    assert sorted(standin.stopped_sessions()) == sorted(runtime_session_id(r) for r in requests)


@pytest.mark.slow
def test_limiter_adapts_to_a_lower_quota_than_configured() -> None:
    """Configured for 25 TPS against an account allowed 10: throttled, adapts, loses nothing."""
    standin = AcrStandIn(app=_agent(), tps_limit=10.0)
    requests = [make_request() for _ in range(20)]
    with StandInServer(standin) as server:
        runtime = make_runtime(server.url, tps_limit=25.0)
        results = asyncio.run(_run_all(runtime, requests))
    assert [r.status for r in results] == [RolloutStatus.OK] * 20, [r.error for r in results]
    throttled = sum(1 for c in standin.calls if c.status == 429)
    accepted = len(standin.accepted())
    print(f"{throttled} throttled of {throttled + accepted} calls")
    assert accepted == 60 and 0 < throttled < accepted

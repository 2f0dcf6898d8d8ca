"""``RolloutRunner.run_one`` classifies what the gateway saw of a rollout.

The gateway and its sessions are real (in process); the model is a scripted
sampler and the runtime is a stand-in whose "agent" is a coroutine calling
``Gateway.run_turn`` directly: the agent process and its HTTP hop are the edge
faked here (the loop tests run real agent processes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from core.errors import ConfigError, SamplerError
from core.gateway import Gateway, GatewayConfig
from core.gateway.errors import GatewayError
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.rollout import RolloutLimits, RolloutRunner, classify
from core.samplers import ScriptedSampler, encode_reply
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SampleResult,
    SamplingParams,
)

Agent = Callable[[Gateway, RolloutRequest], Awaitable[RolloutResult]]


class FlakySampler(ScriptedSampler):
    """Replies "ok"; the calls numbered in ``fail`` raise, those in ``abort`` come back
    aborted (what an engine returns when weights are swapped under a request)."""

    def __init__(self, tok: Any, *, fail: Sequence[int] = (), abort: Sequence[int] = (), delay_s: float = 0.0):
        super().__init__(tokenizer=tok, default=encode_reply(tok, "ok"), delay_s=delay_s)
        self.fail, self.abort, self.n = set(fail), set(abort), 0

    async def sample(self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str) -> SampleResult:
        call, self.n = self.n, self.n + 1
        if call in self.fail:
            raise SamplerError("engine fell over (scripted)")
        result = await super().sample(prompt_token_ids, params, session_id=session_id)
        if call in self.abort:
            return SampleResult(result.token_ids[:1], result.logprobs[:1], FinishReason.ABORT, 0)
        return result


class CoroutineRuntime:
    """Runs ``agent(gateway, request)`` in process (stand-in for an agent process)."""

    def __init__(self, gateway: Gateway, agent: Agent) -> None:
        self.gateway, self.agent = gateway, agent

    async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
        return await self.agent(self.gateway, request)


def _turn() -> TurnRequest:
    return TurnRequest(units=openai_units([{"role": "user", "content": "hi"}]))


def _ok(request: RolloutRequest, reward: float = 1.0) -> RolloutResult:
    return RolloutResult(request.rollout_id, RolloutStatus.OK, reward=reward)


def _run(tok: Any, agent: Agent, *, sampler: ScriptedSampler | None = None, **runner_kw: Any) -> Any:
    gateway = Gateway(
        tokenizer=tok,
        sampler=sampler or FlakySampler(tok),
        config=GatewayConfig(history_mode="tree"),
        model_id="tiny",
    )
    runner = RolloutRunner(
        gateway=gateway,
        base_url="http://127.0.0.1:0/v1",
        runtime=CoroutineRuntime(gateway, agent),
        model_id="tiny",
        limits=RolloutLimits(max_concurrency=4, timeout_s=5.0, **runner_kw),
    )

    async def go() -> Any:
        outcome = await runner.run_one({"q": 1}, group_id="g", sampling=SamplingParams(max_tokens=8))
        assert gateway.sessions() == []  # the runner dropped the session whatever happened
        return outcome

    return asyncio.run(go())


async def _one_call(gw: Gateway, req: RolloutRequest) -> RolloutResult:
    await gw.run_turn(req.session_id, _turn())
    return _ok(req)


async def _swallow_503_then_call(gw: Gateway, req: RolloutRequest) -> RolloutResult:
    with contextlib.suppress(GatewayError):
        await gw.run_turn(req.session_id, _turn())  # 503: the agent shrugs and carries on
    await gw.run_turn(req.session_id, _turn())
    return _ok(req)


def test_clean_rollout_is_ok_and_reports_its_fault_counters(byte_tokenizer: Any) -> None:
    outcome = _run(byte_tokenizer, _one_call)
    assert outcome.result.status is RolloutStatus.OK and outcome.result.reward == 1.0
    assert len(outcome.rows) == 1 and outcome.rows[0].status is RolloutStatus.OK
    assert outcome.faults["model_turns"] == 1
    assert outcome.faults["sampler_errors"] == outcome.faults["in_flight_at_finish"] == 0


def test_a_swallowed_sampler_error_excludes_the_rollout(byte_tokenizer: Any) -> None:
    outcome = _run(byte_tokenizer, _swallow_503_then_call, sampler=FlakySampler(byte_tokenizer, fail=[0]))
    assert outcome.result.status is RolloutStatus.SAMPLER_ERROR
    assert outcome.result.reward is None and "sampler_errors=1" in (outcome.result.error or "")
    # the row the second call produced is kept for inspection but stamped as failed
    assert [r.status for r in outcome.rows] == [RolloutStatus.SAMPLER_ERROR]
    assert all(r.reward is None for r in outcome.rows)
    assert outcome.faults["sampler_errors"] == 1


def test_a_rollout_whose_only_call_failed_is_a_sampler_error_not_no_model_calls(byte_tokenizer: Any) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        with contextlib.suppress(GatewayError):
            await gw.run_turn(req.session_id, _turn())
        return _ok(req, 0.0)

    outcome = _run(byte_tokenizer, agent, sampler=FlakySampler(byte_tokenizer, fail=[0]))
    assert outcome.rows == []  # the counter lives on the session, not on a row
    assert outcome.result.status is RolloutStatus.SAMPLER_ERROR


def test_a_turn_in_flight_when_the_agent_returns_excludes_the_rollout(byte_tokenizer: Any) -> None:
    pending: list[asyncio.Task[Any]] = []

    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        await gw.run_turn(req.session_id, _turn())
        pending.append(asyncio.ensure_future(gw.run_turn(req.session_id, _turn())))  # never awaited
        await asyncio.sleep(0.01)
        return _ok(req)

    async def go() -> Any:
        gw = Gateway(tokenizer=byte_tokenizer, sampler=FlakySampler(byte_tokenizer, delay_s=0.2),
                     config=GatewayConfig(history_mode="tree"), model_id="tiny")
        runner = RolloutRunner(gateway=gw, base_url="http://x/v1", runtime=CoroutineRuntime(gw, agent),
                               model_id="tiny", limits=RolloutLimits(max_concurrency=1, timeout_s=5.0))
        outcome = await runner.run_one({}, group_id="g", sampling=SamplingParams(max_tokens=8))
        with contextlib.suppress(GatewayError):
            await pending[0]  # it finds its session gone
        return outcome

    outcome = asyncio.run(go())
    assert outcome.faults["in_flight_at_finish"] == 1
    assert outcome.result.status is RolloutStatus.SAMPLER_ERROR
    assert "in_flight_at_finish=1" in (outcome.result.error or "")


def test_aborted_turns_exclude_by_default_and_exclude_on_can_allow_them(byte_tokenizer: Any) -> None:
    def sampler() -> FlakySampler:
        return FlakySampler(byte_tokenizer, abort=[0])

    strict = _run(byte_tokenizer, _swallow_503_then_call, sampler=sampler())
    assert strict.faults["aborted_turns"] == 1
    assert strict.result.status is RolloutStatus.SAMPLER_ERROR
    lenient = _run(byte_tokenizer, _swallow_503_then_call, sampler=sampler(), exclude_on=["sampler_error"])
    assert lenient.result.status is RolloutStatus.OK and lenient.result.reward == 1.0


def test_disconnected_turns_are_counted_and_only_exclude_when_asked(byte_tokenizer: Any) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        call = asyncio.ensure_future(gw.run_turn(req.session_id, _turn()))
        await asyncio.sleep(0.02)
        call.cancel()  # the client went away mid-generation
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await gw.run_turn(req.session_id, _turn())
        return _ok(req)

    def sampler() -> FlakySampler:
        return FlakySampler(byte_tokenizer, delay_s=0.05)

    default = _run(byte_tokenizer, agent, sampler=sampler())
    assert default.faults["disconnected_turns"] == 1
    assert default.result.status is RolloutStatus.OK
    strict = _run(byte_tokenizer, agent, sampler=sampler(),
                  exclude_on=["sampler_error", "in_flight", "aborted", "disconnected"])
    assert strict.result.status is RolloutStatus.SAMPLER_ERROR


def test_a_reward_without_model_calls_is_no_model_calls(byte_tokenizer: Any) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        return _ok(req)

    outcome = _run(byte_tokenizer, agent)
    assert outcome.result.status is RolloutStatus.NO_MODEL_CALLS and outcome.result.reward is None
    assert "without a model call" in (outcome.result.error or "")


def test_a_failed_rollout_keeps_its_own_status(byte_tokenizer: Any) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        with contextlib.suppress(GatewayError):
            await gw.run_turn(req.session_id, _turn())
        return RolloutResult(req.rollout_id, RolloutStatus.CRASHED, error="boom")

    outcome = _run(byte_tokenizer, agent, sampler=FlakySampler(byte_tokenizer, fail=[0]))
    assert outcome.result.status is RolloutStatus.CRASHED and outcome.result.error == "boom"


@pytest.mark.parametrize(("reward", "status"), [(1e9, RolloutStatus.OK), (-2e9, RolloutStatus.INVALID_REWARD),
                                                (1e200, RolloutStatus.INVALID_REWARD)])
def test_rewards_beyond_max_abs_reward_are_invalid(byte_tokenizer: Any, reward: float, status: RolloutStatus) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        await gw.run_turn(req.session_id, _turn())
        return _ok(req, reward)

    outcome = _run(byte_tokenizer, agent)
    assert outcome.result.status is status
    if status is RolloutStatus.INVALID_REWARD:
        assert "trainer.max_abs_reward" in (outcome.result.error or "")


def test_exclude_on_and_max_abs_reward_are_checked(byte_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"exclude_on has \['sampler_errors'\]; choose from"):
        _run(byte_tokenizer, _one_call, exclude_on=["sampler_errors"])
    with pytest.raises(ConfigError, match="max_abs_reward"):
        _run(byte_tokenizer, _one_call, max_abs_reward=float("inf"))


def test_classify_leaves_a_clean_result_untouched() -> None:
    result = RolloutResult("r", RolloutStatus.OK, reward=0.5)
    assert classify(result, {"model_turns": 2}) is result


# -- cleanup (#15.12): a session finished or dropped by someone else --------------------


def test_a_session_the_agent_already_finished_keeps_its_rows(byte_tokenizer: Any) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        await gw.run_turn(req.session_id, _turn())
        gw.finish_session(req.session_id)  # e.g. POST /admin/sessions/<id>/finish
        return _ok(req)

    outcome = _run(byte_tokenizer, agent)
    assert outcome.result.status is RolloutStatus.OK and len(outcome.rows) == 1
    assert outcome.faults["finished_early"] == 1


def test_a_dropped_session_fails_only_its_own_rollout(byte_tokenizer: Any) -> None:
    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        await gw.run_turn(req.session_id, _turn())
        if req.payload["drop"]:
            gw.drop_session(req.session_id)  # e.g. DELETE /admin/sessions/<id>
        return _ok(req)

    gateway = Gateway(tokenizer=byte_tokenizer, sampler=FlakySampler(byte_tokenizer),
                      config=GatewayConfig(history_mode="tree"), model_id="tiny")
    runner = RolloutRunner(gateway=gateway, base_url="http://x/v1", runtime=CoroutineRuntime(gateway, agent),
                           model_id="tiny", limits=RolloutLimits(max_concurrency=4, timeout_s=5.0))
    outcomes = asyncio.run(runner.run_groups(
        [("a", {"drop": True}), ("b", {"drop": False})], group_size=2, sampling=SamplingParams(max_tokens=8)
    ))
    by_group = {o.request.group_id: o for o in outcomes}
    lost = by_group["a"]
    assert lost.result.status is RolloutStatus.CRASHED and lost.rows == []
    assert "session was dropped" in (lost.result.error or "") and lost.faults["session_lost"] == 1
    assert by_group["b"].result.status is RolloutStatus.OK and len(by_group["b"].rows) == 1


def test_a_cancelled_rollout_stops_accepting_a_late_reward(byte_tokenizer: Any) -> None:
    """A rollout cancelled mid-run (the async pool closing) is forgotten by
    ``gateway.late_rewards``; it used to stay expected forever (a leak per
    cancelled rollout, and posts for it were accepted and kept)."""
    started = asyncio.Event()

    async def agent(gw: Gateway, req: RolloutRequest) -> RolloutResult:
        started.set()
        await asyncio.sleep(60)
        return _ok(req)

    gateway = Gateway(tokenizer=byte_tokenizer, sampler=FlakySampler(byte_tokenizer),
                      config=GatewayConfig(history_mode="tree"), model_id="tiny")
    runner = RolloutRunner(gateway=gateway, base_url="http://x/v1", runtime=CoroutineRuntime(gateway, agent),
                           model_id="tiny", limits=RolloutLimits(max_concurrency=4, timeout_s=5.0))

    async def main() -> None:
        task = asyncio.create_task(runner.run_one({}, group_id="g", sampling=SamplingParams(max_tokens=8)))
        await started.wait()
        assert len(gateway.late_rewards._expected) == 1
        rid = next(iter(gateway.late_rewards._expected))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with pytest.raises(ConfigError, match="no running or pending rollout"):
            gateway.late_rewards.post(rid, 1.0)
        assert gateway.late_rewards._expected == set()

    asyncio.run(main())

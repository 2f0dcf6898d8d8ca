"""End to end through real boto3: agents behind the AgentCore stand-in, one process per session.

The data plane is ``core.testing.agentcore_standin`` and S3 is moto's server, both on
127.0.0.1 (AWS is a network edge CI cannot reach); everything else is real:
boto3's ``bedrock-agentcore`` and ``s3`` clients, agent processes, the agents'
own S3 writes, and agents written for agentcore-rl-toolkit 0.2.0.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3
import pytest
from acr_helpers import BUCKET, agent_env, make_request, make_runtime

from core.agent._protocol import result_session_id
from core.runtime.agentcore import runtime_session_id
from core.testing.agentcore_standin import AcrStandIn, StandInServer
from core.types import RolloutRequest, RolloutResult, RolloutStatus

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _run(runtime: Any, requests: list[RolloutRequest]) -> list[RolloutResult]:
    async def main() -> list[RolloutResult]:
        await runtime.start()
        try:
            return list(await asyncio.gather(*(runtime.run_rollout(r) for r in requests)))
        finally:
            await runtime.aclose()

    return asyncio.run(main())


def test_s3_channel_rewards_back_and_sessions_stopped(s3_endpoint: str) -> None:
    standin = AcrStandIn(
        agent="acr_test_agents:app", env=agent_env(AWS_ENDPOINT_URL_S3=s3_endpoint)
    )
    requests = [make_request({"reward": 0.25 * i}, group=f"g{i % 2}") for i in range(4)]
    with StandInServer(standin) as server:
        runtime = make_runtime(
            server.url, result_channel="s3", s3_bucket=BUCKET, s3_endpoint_url=s3_endpoint,
            s3_exp_id="exp-e2e",
        )
        results = _run(runtime, requests)
        pids = {r.metrics.get("pid") for r in results}
    assert [r.status for r in results] == [RolloutStatus.OK] * 4, [r.error for r in results]
    assert [r.reward for r in results] == [0.0, 0.25, 0.5, 0.75]
    assert all(r.metrics["key_is_session"] == 1.0 and r.metrics["base_url_ok"] == 1.0 for r in results)
    assert len(pids) == 4, "each session must run in its own agent process"
    # Each session: exactly one invocation (the S3 channel never polls the data plane), then a stop.
    sids = [runtime_session_id(r) for r in requests]
    assert sorted(c.session_id for c in standin.accepted("invoke")) == sorted(sids)
    assert sorted(standin.stopped_sessions()) == sorted(sids)
    # The agent saved its result where the toolkit would, with the toolkit's metadata.
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-west-2")
    req = requests[1]
    body = json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"exp-e2e/g1/{result_session_id(req.session_id)}.json")["Body"].read()
    )
    assert body["reward"] == 0.25 and body["status_code"] == 200
    rollout = body["payload"]["_rollout"]
    assert rollout["exp_id"] == "exp-e2e" and rollout["input_id"] == "g1"
    assert rollout["s3_bucket"] == BUCKET and rollout["model_id"] == req.model_id
    # Not the credentials: no api_key (the session id), no gateway URL.
    assert "api_key" not in rollout and "base_url" not in rollout and "_config" not in body["payload"]


def test_http_channel_rewards_back_and_agent_error(s3_endpoint: str) -> None:
    standin = AcrStandIn(agent="acr_test_agents:app", env=agent_env())
    requests = [
        make_request({"reward": 1.0, "sleep_s": 0.5}),
        make_request({"reward": 0.5}),
        make_request({"mode": "raise", "tag": "xyz"}),
    ]
    with StandInServer(standin) as server:
        runtime = make_runtime(server.url, result_channel="http")
        results = _run(runtime, requests)
    assert [r.status for r in results[:2]] == [RolloutStatus.OK] * 2, [r.error for r in results]
    assert [r.reward for r in results[:2]] == [1.0, 0.5]
    assert results[0].metrics["key_is_session"] == 1.0
    assert results[2].status is RolloutStatus.CRASHED
    assert "agent bug on purpose: xyz" in (results[2].error or "")
    # Long-polling keeps a rollout to a handful of invocations, not one per poll interval.
    per_session = [sum(1 for c in standin.accepted("invoke") if c.session_id == runtime_session_id(r)) for r in requests]
    assert all(2 <= n <= 3 for n in per_session), per_session
    assert sorted(standin.stopped_sessions()) == sorted(runtime_session_id(r) for r in requests)


def test_agentcore_rl_toolkit_agents_run_unchanged(s3_endpoint: str) -> None:
    """Both of the toolkit's app flavours, its real classes, through both channels."""
    s3_standin = AcrStandIn(
        agent="acr_test_agents:art_rl_app", env=agent_env(AWS_ENDPOINT_URL_S3=s3_endpoint)
    )
    http_standin = AcrStandIn(agent="acr_test_agents:art_runtime_app", env=agent_env())
    with StandInServer(s3_standin) as s3_server, StandInServer(http_standin) as http_server:
        s3_results = _run(
            make_runtime(s3_server.url, result_channel="s3", s3_bucket=BUCKET, s3_endpoint_url=s3_endpoint),
            [make_request({"reward": 0.75})],
        )
        http_results = _run(
            make_runtime(http_server.url, result_channel="http"),
            [make_request({"reward": 0.5, "sleep_s": 0.3})],
        )
    for result, reward in ((s3_results[0], 0.75), (http_results[0], 0.5)):
        assert result.status is RolloutStatus.OK, result.error
        assert result.reward == reward and result.metrics["key_is_session"] == 1.0
    assert len(s3_standin.stopped_sessions()) == 1 and len(http_standin.stopped_sessions()) == 1

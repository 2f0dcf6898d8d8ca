"""Trainer → gateway → AgentCore (stand-in) → agent → gateway: rewards and traces come back.

The trainer's own ``RolloutRunner`` drives the ``agentcore`` runtime; agents
behind the stand-in (one process per session) call the real gateway with the
``openai`` SDK, the model being a scripted sampler. The stand-in and moto S3
replace AWS, which CI cannot reach; the gateway is loopback, which the
preflight allows only because the data plane is loopback too.
"""

from __future__ import annotations

import asyncio

import pytest
from acr_helpers import BUCKET, agent_env, make_runtime

from core.gateway import Gateway, GatewayConfig, GatewayServer
from core.rollout import RolloutLimits, RolloutOutcome, RolloutRunner
from core.runtime.agentcore import runtime_session_id
from core.samplers import ScriptedSampler, encode_reply
from core.testing.agentcore_standin import AcrStandIn, StandInServer
from core.tokenizer import build_tiny_tokenizer
from core.types import RolloutStatus, SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("channel", ["s3", "http"])
def test_rollouts_through_agentcore_capture_traces(channel: str, s3_endpoint: str) -> None:
    tok = build_tiny_tokenizer()
    reply = encode_reply(tok, "7")
    standin = AcrStandIn(agent="acr_test_agents:app", env=agent_env(AWS_ENDPOINT_URL_S3=s3_endpoint))

    async def main(endpoint: str) -> list[RolloutOutcome]:
        sampler = ScriptedSampler(default=reply, tokenizer=tok)
        gateway = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(), model_id="tiny")
        server = GatewayServer(gateway, host="127.0.0.1", port=0)
        await server.start()
        runtime = make_runtime(
            endpoint, result_channel=channel, s3_bucket=BUCKET, s3_endpoint_url=s3_endpoint
        )
        await runtime.start()
        try:
            runner = RolloutRunner(
                gateway=gateway,
                base_url=server.base_url,
                runtime=runtime,
                model_id="tiny",
                limits=RolloutLimits(max_concurrency=4, timeout_s=60.0),
            )
            return await runner.run_groups(
                [("g0", {"call_model": True, "prompt": "6+1", "reward": 1.0}),
                 ("g1", {"call_model": True, "prompt": "6+1", "reward": 0.5})],
                group_size=2,
                sampling=SamplingParams(max_tokens=8),
            )
        finally:
            await runtime.aclose()
            await server.stop()

    with StandInServer(standin) as server:
        outcomes = asyncio.run(main(server.url))
    assert [o.result.status for o in outcomes] == [RolloutStatus.OK] * 4, [o.result.error for o in outcomes]
    assert sorted(o.result.reward for o in outcomes) == [0.5, 0.5, 1.0, 1.0]
    for o in outcomes:
        assert o.result.metrics["reply_chars"] == 1.0  # the agent got the sampler's "7"
        assert len(o.rows) == 1, "each rollout's turn was captured under its own session"
        row = o.rows[0]
        row.validate()
        assert row.reward == o.result.reward and row.group_id == o.request.group_id
        generated = [t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m]
        assert generated == reply
    assert sorted(standin.stopped_sessions()) == sorted(runtime_session_id(o.request) for o in outcomes)

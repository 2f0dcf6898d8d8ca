"""The agentcore runtime's S3 channel: the trainer picks the result key; no credentials stored.

The data plane is the stand-in and S3 is moto's server, both on 127.0.0.1
(AWS is a network edge CI cannot reach); the clients are real boto3. The
stand-in serves the agents in-process, which is all these checks need.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3
import pytest
from acr_helpers import BUCKET, make_request, make_runtime
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.agent import AgentApp, ModelConfig
from core.agent._protocol import result_session_id
from core.testing.agentcore_standin import AcrStandIn, StandInServer
from core.types import RolloutRequest, RolloutResult, RolloutStatus

pytestmark = pytest.mark.integration


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-west-2")


def _rogue_agent(endpoint: str) -> Starlette:
    """Saves a perfect reward under a key of its own and names that key in its reply."""

    async def invocations(request: Request) -> JSONResponse:
        rollout = json.loads(await request.body())["_rollout"]
        key = f"{rollout['exp_id']}/{rollout['input_id']}/someone-elses-session.json"
        await asyncio.to_thread(
            _s3(endpoint).put_object,
            Bucket=rollout["s3_bucket"],
            Key=key,
            Body=json.dumps({"rewards": [1.0]}).encode(),
        )
        return JSONResponse({"status": "processing", "s3_bucket": BUCKET, "result_key": key})

    return Starlette(routes=[Route("/invocations", invocations, methods=["POST"])])


def _run(
    app: Any, endpoint: str, exp_id: str, requests: list[RolloutRequest]
) -> list[RolloutResult]:
    async def main() -> list[RolloutResult]:
        runtime = make_runtime(
            server.url,
            result_channel="s3",
            s3_bucket=BUCKET,
            s3_endpoint_url=endpoint,
            s3_exp_id=exp_id,
        )
        await runtime.start()
        try:
            return list(await asyncio.gather(*(runtime.run_rollout(r) for r in requests)))
        finally:
            await runtime.aclose()

    with StandInServer(AcrStandIn(app=app)) as server:
        return asyncio.run(main())


def test_a_result_under_a_key_the_agent_chose_is_refused(s3_endpoint: str) -> None:
    req = make_request(group="g3", timeout_s=10.0)
    (res,) = _run(_rogue_agent(s3_endpoint), s3_endpoint, "exp-rogue-acr", [req])
    assert res.status is RolloutStatus.CRASHED and res.reward is None
    error = res.error or ""
    assert "exp-rogue-acr/g3/someone-elses-session.json" in error and "refused" in error
    assert f"exp-rogue-acr/g3/{result_session_id(req.session_id)}.json" in error


def test_the_stored_result_holds_no_session_key(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)  # the in-process agent's own writes
    app = AgentApp()

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        cfg = ModelConfig.from_payload(payload)
        return {
            "reward": 0.75,
            "metrics": {"key_is_session": float(cfg.api_key == payload["expect_key"])},
        }

    req = make_request({"row": "q9"}, group="g4")
    (res,) = _run(app, s3_endpoint, "exp-creds-acr", [req])
    assert res.status is RolloutStatus.OK and res.reward == 0.75, res.error
    assert res.metrics["key_is_session"] == 1.0  # the agent did get its key
    raw = _s3(s3_endpoint).get_object(Bucket=BUCKET, Key=f"exp-creds-acr/g4/{result_session_id(req.session_id)}.json")
    body = raw["Body"].read()
    # expect_key in the row is the test's own copy of the key: drop it before looking.
    saved = json.loads(body)
    saved["payload"].pop("expect_key")
    assert req.session_id not in json.dumps(saved) and "api_key" not in json.dumps(saved)
    assert saved["payload"]["row"] == "q9" and saved["payload"]["_rollout"]["input_id"] == "g4"

"""The S3 result channel of the local runtime: the trainer picks the key, no credentials stored.

S3 is moto's server mode on 127.0.0.1, standing in for AWS we cannot reach
from CI; agents are real processes writing with real boto3.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from local_runtime_helpers import agent_env, make_request

from core.agent._protocol import result_session_id
from core.runtime.local import LocalRuntime
from core.types import RolloutRequest, RolloutResult, RolloutStatus
from tests.runtime.moto_s3 import moto_s3_server

pytestmark = pytest.mark.integration

BUCKET = "tracerl-s3-channel"
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server in this process (threaded), with the results bucket created."""
    with moto_s3_server(BUCKET) as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials for the runtime's own S3 client (it polls the results)."""
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _run(
    agent: str, endpoint: str, exp_id: str, requests: list[RolloutRequest]
) -> list[RolloutResult]:
    async def main() -> list[RolloutResult]:
        rt = LocalRuntime(
            agent,
            env=agent_env(AWS_ENDPOINT_URL_S3=endpoint, **CREDS),
            num_processes=1,
            result_channel="s3",
            s3_bucket=BUCKET,
            s3_endpoint_url=endpoint,
            s3_exp_id=exp_id,
        )
        await rt.start()
        try:
            return list(await asyncio.gather(*(rt.run_rollout(r) for r in requests)))
        finally:
            await rt.aclose()

    return asyncio.run(main())


def _get(endpoint: str, key: str) -> bytes:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **_keys())
    body: Any = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
    return bytes(body.read())


def test_a_result_under_a_key_the_agent_chose_is_refused(s3_endpoint: str) -> None:
    req = make_request({}, timeout_s=10.0, group="g7")
    (res,) = _run("rogue_s3_agent:app", s3_endpoint, "exp-rogue", [req])
    assert res.status is RolloutStatus.CRASHED and res.reward is None
    expected = f"exp-rogue/g7/{result_session_id(req.session_id)}.json"
    assert "exp-rogue/g7/not-my-session.json" in (res.error or "")
    assert expected in (res.error or "") and "refused" in (res.error or "")
    # The planted object is there; the trainer simply did not read it.
    assert json.loads(_get(s3_endpoint, "exp-rogue/g7/not-my-session.json")) == {"rewards": [1.0]}


def test_a_handler_cannot_steer_its_result_onto_another_key(s3_endpoint: str) -> None:
    """The app writes under the key it derived when the request arrived, whatever the
    handler does to its context afterwards."""
    req = make_request({"mode": "steer_key", "sibling": "sibling-session"}, timeout_s=10.0, group="g3")
    (res,) = _run("tracerl_test_agents:app", s3_endpoint, "exp-steer", [req])
    assert res.status is RolloutStatus.OK and res.reward == 1.0, res.error
    assert json.loads(_get(s3_endpoint, f"exp-steer/g3/{result_session_id(req.session_id)}.json"))["reward"] == 1.0
    with pytest.raises(Exception, match="NoSuchKey|Not Found|404"):
        _get(s3_endpoint, "exp-steer/g3/sibling-session.json")


def test_the_stored_result_holds_no_session_key(s3_endpoint: str) -> None:
    """The saved object has the reward and the dataset row, not the api key (the session id)."""
    req = make_request({"mode": "quiet", "reward": 0.5, "row": "q1"}, group="g1")
    ok, bad = _run(
        "tracerl_test_agents:app",
        s3_endpoint,
        "exp-creds",
        [req, make_request({"mode": "raise", "tag": "t"}, group="g2")],
    )
    assert ok.status is RolloutStatus.OK and ok.reward == 0.5, ok.error
    assert bad.status is RolloutStatus.CRASHED and "agent bug on purpose" in (bad.error or "")
    raw = _get(s3_endpoint, f"exp-creds/g1/{result_session_id(req.session_id)}.json")
    assert req.session_id.encode() not in raw and b"api_key" not in raw
    assert req.base_url.encode() not in raw  # the gateway's address stays out too
    saved = json.loads(raw)
    assert saved["reward"] == 0.5 and saved["status_code"] == 200
    assert saved["payload"]["row"] == "q1" and saved["payload"]["mode"] == "quiet"
    assert saved["payload"]["_rollout"] == {
        "exp_id": "exp-creds",
        "input_id": "g1",
        "s3_bucket": BUCKET,
        "model_id": req.model_id,
        "sampling_params": req.sampling_params,
    }
    assert "_config" not in saved["payload"] and "result_key" not in saved


def test_a_timed_out_s3_rollout_is_cancelled_in_the_agent(s3_endpoint: str) -> None:
    """The S3 channel cancels a core.agent invocation on timeout, as the HTTP channel does."""

    async def main() -> tuple[RolloutResult, str]:
        rt = LocalRuntime(
            "tracerl_test_agents:app",
            env=agent_env(AWS_ENDPOINT_URL_S3=s3_endpoint, **CREDS),
            num_processes=1,
            result_channel="s3",
            s3_bucket=BUCKET,
            s3_endpoint_url=s3_endpoint,
            s3_exp_id="exp-cancel",
        )
        await rt.start()
        try:
            res = await rt.run_rollout(make_request({"mode": "hang"}, timeout_s=1.0))
            async with httpx.AsyncClient(trust_env=False) as client:
                ping = await client.get(f"{rt.processes[0].base_url}/ping")
            return res, ping.json()["status"]
        finally:
            await rt.aclose()

    res, status = asyncio.run(main())
    assert res.status is RolloutStatus.TIMEOUT
    assert status == "Healthy", "the hung handler must have been cancelled, not left running"


def test_result_keys_hold_a_digest_not_the_session_token(s3_endpoint: str) -> None:
    """#29: the session id is the agent's bearer token; a result key named by it gave
    anyone who can list the bucket every rollout's token. The key holds its SHA-256."""
    import boto3

    req = make_request({"mode": "quiet", "reward": 0.25}, group="g9")
    (res,) = _run("tracerl_test_agents:app", s3_endpoint, "exp-keys", [req])
    assert res.status is RolloutStatus.OK and res.reward == 0.25, res.error
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="exp-keys/")["Contents"]]
    assert keys == [f"exp-keys/g9/{hashlib.sha256(req.session_id.encode()).hexdigest()}.json"]
    assert not any(req.session_id in k for k in keys)

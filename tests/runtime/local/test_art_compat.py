"""Agents written for agentcore-rl-toolkit (ART) 0.2.0 run under the local runtime.

``art_agent_original`` imports the real ``AgentCoreRLApp`` from the PyPI package
(installed in the test environment); ``art_agent_ported`` is the same file with
only the import changed to ``core.agent``. Results travel the toolkit's way:
the agent writes JSON to S3, the runtime polls it with real boto3. S3 is moto's
server mode on 127.0.0.1, standing in for AWS we cannot reach from CI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_runtime_helpers import AGENTS_DIR, agent_env, make_request

from core.agent._protocol import result_session_id
from core.runtime.local import LocalRuntime
from core.types import RolloutStatus
from tests.runtime.moto_s3 import moto_s3_server

pytestmark = pytest.mark.integration

BUCKET = "tracerl-rollouts"
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


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)


def test_ported_agent_differs_only_in_the_import() -> None:
    original = (AGENTS_DIR / "art_agent_original.py").read_text().splitlines()
    ported = (AGENTS_DIR / "art_agent_ported.py").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, ported, strict=True) if a != b]
    assert changed == [
        ("from agentcore_rl_toolkit import AgentCoreRLApp", "from core.agent import AgentCoreRLApp")
    ]


@pytest.mark.parametrize("module", ["art_agent_original", "art_agent_ported"])
def test_art_agent_runs_unchanged_with_results_in_s3(
    module: str, s3_endpoint: str, aws_env: None
) -> None:
    import boto3

    async def main() -> None:
        rt = LocalRuntime(
            f"{module}:app",
            env=agent_env(AWS_ENDPOINT_URL_S3=s3_endpoint, **CREDS),
            num_processes=2,
            result_channel="s3",
            s3_bucket=BUCKET,
            s3_endpoint_url=s3_endpoint,
            s3_exp_id=f"exp-{module}",
        )
        await rt.start()
        try:
            reqs = [
                make_request({"reward": i / 8, "sleep_s": 0.1}, group=f"g{i % 2}") for i in range(8)
            ]
            bad = make_request({"mode": "raise", "reward": 0})
            results = await asyncio.gather(*(rt.run_rollout(r) for r in [*reqs, bad]))
        finally:
            await rt.aclose()
        for req, res in zip(reqs, results[:-1], strict=True):
            assert res.status is RolloutStatus.OK, res.error
            assert res.reward == req.payload["reward"]  # the last element of "rewards"
            assert res.metrics == {"turns": 1.0}
        failed = results[-1]
        assert failed.status is RolloutStatus.CRASHED
        assert "toolkit agent failed on purpose" in (failed.error or "")

        s3 = boto3.client("s3", endpoint_url=s3_endpoint)
        req = reqs[3]
        key = f"exp-{module}/{req.group_id}/{result_session_id(req.session_id)}.json"
        saved = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        assert saved["status_code"] == 200
        if module == "art_agent_original":  # the toolkit saves the whole payload, key included
            assert saved["result_key"] == key
            assert saved["payload"]["_rollout"]["api_key"] == req.session_id
        else:  # core.agent leaves the session key out (the agent's own echo below is its choice)
            assert "result_key" not in saved and "_config" not in saved["payload"]
            assert "api_key" not in saved["payload"]["_rollout"]
        assert saved["echo"] == {
            "base_url": req.base_url,
            "model_id": req.model_id,
            "api_key": req.session_id,
            "session": result_session_id(req.session_id),  # the header holds the digest (#29)
        }
        assert saved["payload"]["_rollout"]["input_id"] == req.group_id

    asyncio.run(main())


def test_ported_agent_also_serves_start_get_over_http(tmp_path: Path) -> None:
    """The same ported agent needs no S3 at all when the runtime polls over HTTP."""

    async def main() -> Any:
        rt = LocalRuntime("art_agent_ported:app", env=agent_env(), num_processes=1)
        await rt.start()
        try:
            return await rt.run_rollout(make_request({"reward": 0.5}))
        finally:
            await rt.aclose()

    res = asyncio.run(main())
    assert res.status is RolloutStatus.OK and res.reward == 0.5

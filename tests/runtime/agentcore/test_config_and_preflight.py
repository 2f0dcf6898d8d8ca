"""Config, ARN parsing, the loopback-gateway preflight, session ids and light imports.

Nothing here reaches a network: the preflight refuses before any call is made.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from acr_helpers import make_request
from omegaconf import OmegaConf

from core.errors import ConfigError
from core.runtime.agentcore import (
    AgentCoreRuntime,
    AgentCoreRuntimeConfig,
    TpsLimiter,
    is_local_host,
    parse_runtime_arn,
    runtime_session_id,
)
from core.runtime.agentcore._preflight import public_base_url, runtime_is_remote
from core.testing.agentcore_standin import EXAMPLE_ARN
from core.types import RolloutStatus


def test_arn_parsing_and_region_from_arn() -> None:
    arn = parse_runtime_arn("arn:aws:bedrock-agentcore:eu-central-1:123456789012:runtime/my_agent-Ab12")
    assert (arn.region, arn.account, arn.name, arn.partition) == (
        "eu-central-1", "123456789012", "my_agent-Ab12", "aws"
    )
    with pytest.raises(ConfigError, match="not an AgentCore Runtime ARN"):
        parse_runtime_arn("arn:aws:bedrock:us-east-1:123456789012:agent/x")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"agent_runtime_arn": ""}, "agent_runtime_arn is empty"),
        ({"result_channel": "s3", "s3_bucket": ""}, "needs runtime.s3_bucket"),
        ({"result_channel": "sqs"}, "must be 's3' or 'http'"),
        ({"tps_limit": 0.0}, "tps_limit must be > 0"),
    ],
)
def test_bad_settings_fail_at_start_with_the_fix(overrides: dict[str, object], match: str) -> None:
    fields = {"agent_runtime_arn": EXAMPLE_ARN, "result_channel": "http", "endpoint_url": "http://127.0.0.1:9"}
    runtime = AgentCoreRuntime(AgentCoreRuntimeConfig(**{**fields, **overrides}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):
        asyncio.run(runtime.start())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "0.0.0.0", "127.3.4.5"])
def test_loopback_gateway_with_a_remote_runtime_is_refused(host: str) -> None:
    runtime = AgentCoreRuntime(
        AgentCoreRuntimeConfig(agent_runtime_arn=EXAMPLE_ARN, result_channel="http"),
        gateway_host=host,
    )
    with pytest.raises(ConfigError) as info:
        asyncio.run(runtime.start())
    message = str(info.value)
    assert "cannot reach" in message and "train on nothing" in message
    assert "runtime.gateway_public_host" in message


def test_loopback_gateway_is_fine_with_a_loopback_stand_in_and_public_host_overrides() -> None:
    local = AgentCoreRuntime(
        AgentCoreRuntimeConfig(
            agent_runtime_arn=EXAMPLE_ARN, result_channel="http", endpoint_url="http://127.0.0.1:9"
        ),
        gateway_host="127.0.0.1",
    )
    remote = AgentCoreRuntime(
        AgentCoreRuntimeConfig(
            agent_runtime_arn=EXAMPLE_ARN, result_channel="http", gateway_public_host="10.0.3.7"
        ),
        gateway_host="127.0.0.1",
    )

    async def main() -> None:
        for runtime in (local, remote):
            await runtime.start()
            await runtime.aclose()

    asyncio.run(main())
    assert not runtime_is_remote("http://127.0.0.1:9000") and runtime_is_remote("")
    assert runtime_is_remote("https://bedrock-agentcore.us-west-2.amazonaws.com")
    assert not is_local_host("10.0.3.7") and not is_local_host("gw.internal.example.com")
    assert public_base_url("http://127.0.0.1:8000/v1", host="10.0.3.7") == "http://10.0.3.7:8000/v1"
    assert (
        public_base_url("http://0.0.0.0:8000/v1", host="gw.example.com", port=443, scheme="https")
        == "https://gw.example.com:443/v1"
    )


def test_loopback_base_url_per_rollout_is_rejected_before_any_call() -> None:
    """No gateway host known at start (built without a config): the per-rollout check catches it."""
    runtime = AgentCoreRuntime(
        AgentCoreRuntimeConfig(
            agent_runtime_arn=EXAMPLE_ARN, result_channel="http", endpoint_url="http://192.0.2.1:9"
        )
    )

    async def main() -> object:
        await runtime.start()
        try:
            return await runtime.run_rollout(make_request(base_url="http://127.0.0.1:8000/v1"))
        finally:
            await runtime.aclose()

    result = asyncio.run(main())
    assert result.status is RolloutStatus.REJECTED  # type: ignore[attr-defined]
    assert "train on nothing" in result.error  # type: ignore[attr-defined]
    assert runtime.stats()["acr/invoke"] == 0


def test_from_config_reads_runtime_node_and_advertised_gateway_host() -> None:
    cfg = OmegaConf.create(
        {
            "runtime": OmegaConf.structured(
                AgentCoreRuntimeConfig(agent_runtime_arn=EXAMPLE_ARN, tps_limit=7.0, s3_bucket="b")
            ),
            "gateway": {"host": "0.0.0.0", "public_host": "10.1.2.3"},
        }
    )
    runtime = AgentCoreRuntime.from_config(cfg)
    assert runtime.gateway_host == "10.1.2.3"
    assert runtime.config.tps_limit == 7.0 and runtime.config.s3_bucket == "b"


def test_runtime_agentcore_composes_from_hydra() -> None:
    from core.plugins import load_plugins
    from core.testing.fakes import compose

    cfg = compose(["runtime=agentcore", f"runtime.agent_runtime_arn={EXAMPLE_ARN}"], load_plugins())
    assert cfg.runtime.name == "agentcore" and cfg.runtime.tps_limit == 25.0
    assert cfg.runtime.agent_runtime_arn == EXAMPLE_ARN


def test_runtime_session_id_is_at_least_33_characters_stable_and_not_the_token() -> None:
    """The runtimeSessionId names the S3 result key and shows in AgentCore's logs: a
    digest of the gateway session id (a bearer token), never the token (#29)."""
    short = make_request(session_id="tr-short")
    sid = runtime_session_id(short)
    assert len(sid) >= 33 and sid == runtime_session_id(short) and "tr-short" not in sid
    long = make_request(session_id="tr-" + "x" * 32)
    assert runtime_session_id(long) != runtime_session_id(short)
    assert long.session_id not in runtime_session_id(long) and len(runtime_session_id(long)) == 64


def test_limiter_spacing_and_backoff() -> None:
    async def main() -> float:
        limiter = TpsLimiter(50)
        t0 = time.monotonic()
        await asyncio.gather(*(limiter.acquire() for _ in range(101)))
        return time.monotonic() - t0

    elapsed = asyncio.run(main())
    assert 1.9 <= elapsed <= 2.2, elapsed  # 100 intervals of 20 ms
    limiter = TpsLimiter(20, min_rate=2, cooldown_s=0.0)
    for _ in range(10):
        limiter.on_throttle()
    assert limiter.rate == 2 and limiter.throttles == 10
    for _ in range(5):
        limiter.on_success()
    assert limiter.rate == pytest.approx(4.0)


def test_importing_the_runtime_and_stand_in_loads_no_boto3() -> None:
    code = (
        "import sys, core.runtime.agentcore, core.testing.agentcore_standin, core.runtime.plugin;"
        "print([m for m in ('boto3', 'botocore', 'torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_config_key_is_documented() -> None:
    import dataclasses
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "agentcore.md").read_text()
    missing = [
        f.name for f in dataclasses.fields(AgentCoreRuntimeConfig) if f"| `{f.name}` |" not in text
    ]
    assert not missing, f"document these runtime.* keys in docs/agentcore.md: {missing}"
    assert "No call to real AWS was made" in " ".join(text.replace(">", " ").split())

"""Config schema of the ``agentcore`` runtime and the ARN parsing it needs.

Defines ``AgentCoreRuntimeConfig`` (the ``runtime=agentcore`` Hydra node),
``parse_runtime_arn`` and ``RuntimeArn``. Kept free of boto3 so that Hydra can
register the node without the ``aws`` extra installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import ConfigError

_ARN_RE = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):bedrock-agentcore:(?P<region>[a-z0-9-]+):"
    r"(?P<account>\d{12}):runtime/(?P<name>[A-Za-z0-9_-]+)"
)


@dataclass(frozen=True)
class RuntimeArn:
    """The parts of an AgentCore Runtime ARN."""

    arn: str
    """The full ARN, as given."""
    partition: str
    """``aws``, ``aws-cn``, ``aws-us-gov``..."""
    region: str
    """Region the runtime lives in (the data plane endpoint's region)."""
    account: str
    """12-digit account id."""
    name: str
    """Runtime id, e.g. ``my_agent-AbCdEf1234``."""


def parse_runtime_arn(arn: str) -> RuntimeArn:
    """Split an AgentCore Runtime ARN.

    Raises:
        ConfigError: ``arn`` is not ``arn:aws:bedrock-agentcore:<region>:<account>:runtime/<id>``.
    """
    m = _ARN_RE.fullmatch(arn.strip())
    if m is None:
        raise ConfigError(
            f"runtime.agent_runtime_arn={arn!r} is not an AgentCore Runtime ARN; expected "
            "'arn:aws:bedrock-agentcore:<region>:<12-digit account>:runtime/<runtime id>' "
            "(the agentRuntimeArn that create-agent-runtime printed)"
        )
    return RuntimeArn(arn.strip(), m["partition"], m["region"], m["account"], m["name"])


@dataclass
class AgentCoreRuntimeConfig:
    """Rollouts fanned out to AWS Bedrock AgentCore Runtime microVMs (one session per rollout)."""

    name: str = "agentcore"
    """Runtime name."""
    agent_runtime_arn: str = ""
    """ARN of the deployed agent runtime (``arn:aws:bedrock-agentcore:<region>:<acct>:runtime/<id>``)."""
    region: str = ""
    """AWS region of the data plane; empty takes it from the ARN."""
    qualifier: str = ""
    """Endpoint name of the runtime (``DEFAULT`` when empty)."""
    endpoint_url: str = ""
    """Data plane endpoint override; empty is AWS. Point it at ``python -m core.testing.agentcore_standin``
    to try an agent locally (a loopback endpoint also allows a loopback gateway)."""
    result_channel: str = "s3"
    """``s3`` (``AgentCoreRLApp``: the agent saves its result, we HEAD/GET-poll the object) or
    ``http`` (``AgentCoreRuntimeApp``: start/get invocations through InvokeAgentRuntime)."""
    s3_bucket: str = ""
    """Bucket the agents write results to (required for ``result_channel=s3``)."""
    s3_exp_id: str = ""
    """Key prefix of results (``{exp_id}/{group_id}/{session}.json``); empty makes a unique one."""
    s3_endpoint_url: str = ""
    """S3 endpoint override (e.g. a local S3-compatible server); empty is AWS."""
    check_bucket: bool = True
    """At start, HEAD the bucket so a missing bucket or permission fails now, not per rollout."""
    tps_limit: float = 25.0
    """Calls per second to the data plane, invocations and StopRuntimeSession together
    (AgentCore enforces one per-ARN limit; 25 is the default quota)."""
    min_tps: float = 1.0
    """Floor the limiter backs off to while AgentCore throttles."""
    session_timeout: float = 900.0
    """Longest a rollout may run, start to result; the request's own ``timeout_s`` caps it further."""
    max_concurrency: int = 256
    """Most rollouts in flight (sessions alive) at once."""
    cold_start_retries: int = 3
    """Retries of an invocation that failed because the container was not serving yet."""
    cold_start_retry_delay_s: float = 2.0
    """Wait before each cold-start retry."""
    poll_interval_s: float = 0.5
    """First wait between result polls (grows by ``poll_backoff`` up to ``max_poll_interval_s``)."""
    max_poll_interval_s: float = 10.0
    """Longest wait between result polls."""
    poll_backoff: float = 1.5
    """Growth factor of the polling interval."""
    http_wait_s: float = 10.0
    """``http`` channel, tracerl agents only: a get waits up to this long for completion
    (long-poll), so a rollout costs a few invocations instead of one per poll."""
    read_timeout_s: float = 120.0
    """botocore read timeout of one data-plane call."""
    stop_sessions: bool = True
    """Stop each session (StopRuntimeSession) after its result or timeout; a session left
    running keeps its microVM billed until AgentCore's idle timeout."""
    stop_timeout_s: float = 30.0
    """Longest a StopRuntimeSession may take, throttling retries included (best effort)."""
    gateway_public_host: str = ""
    """Host agents dial for the gateway; empty keeps the one the trainer advertises
    (``gateway.public_host``). Must be reachable from the runtime's VPC."""
    gateway_public_port: int = 0
    """Port agents dial for the gateway (a load balancer's); 0 keeps the advertised one."""
    gateway_public_scheme: str = ""
    """``http`` or ``https`` for the gateway URL agents get; empty keeps the advertised one."""

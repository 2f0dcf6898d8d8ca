"""The ``agentcore`` runtime: one AgentCore Runtime session (microVM) per rollout.

Defines ``AgentCoreRuntime`` (a ``core.interfaces.RolloutRuntime``) and
``runtime_session_id``.

A rollout is an InvokeAgentRuntime call whose ``runtimeSessionId`` names a
fresh session, with the gateway's URL, the model id and the gateway session id
(as API key) in the payload's ``_config``. Its result comes back through S3 or
through start/get invocations (see ``_channels``); the session is stopped as
soon as the result is in, or when the rollout times out or is cancelled.
Every call to the data plane goes through one ``TpsLimiter``. Failures come
back as ``RolloutResult`` statuses, never as exceptions.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from core.agent._protocol import result_session_id
from core.errors import ConfigError, RuntimeStartError
from core.runtime._channels import AgentFault, Polling
from core.runtime._results import failed, result_from_output
from core.runtime._run_config import advertised_gateway_host, node_values
from core.runtime.agentcore._channels import AcrSession, HttpResultChannel, S3ResultChannel
from core.runtime.agentcore._client import THROTTLE_CODES, AcrCallError, AcrClient
from core.runtime.agentcore._limiter import TpsLimiter
from core.runtime.agentcore._preflight import (
    check_gateway_reachable,
    public_base_url,
)
from core.runtime.agentcore.config import AgentCoreRuntimeConfig, parse_runtime_arn
from core.runtime.base import RolloutClock, RuntimeBase
from core.types import RolloutRequest, RolloutResult, RolloutStatus

if TYPE_CHECKING:
    from omegaconf import DictConfig

logger = logging.getLogger("core.runtime.agentcore")

MIN_SESSION_ID = 33
"""AgentCore rejects shorter ``runtimeSessionId`` values."""
_REJECTED_CODES = THROTTLE_CODES | {
    "ValidationException",
    "AccessDeniedException",
    "UnauthorizedException",
    "ResourceNotFoundException",
}


def runtime_session_id(request: RolloutRequest) -> str:
    """The ``runtimeSessionId`` of a rollout: ``result_session_id`` of the gateway session id.

    A digest (64 characters: AgentCore needs at least 33), stable per session, so
    the bearer token never appears in AgentCore's session ids or logs, nor in the
    S3 result key the agent derives from it. The agent gets the token itself in
    the payload (``_config.api_key``).
    """
    return result_session_id(request.session_id)


class AgentCoreRuntime(RuntimeBase):
    """Runs rollouts on AgentCore Runtime through boto3 (``runtime=agentcore``).

    Example:
        >>> rt = AgentCoreRuntime(AgentCoreRuntimeConfig(
        ...     agent_runtime_arn="arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/a-1",
        ...     s3_bucket="my-rollouts", gateway_public_host="10.0.3.7"))
        >>> await rt.start()
        >>> result = await rt.run_rollout(request)
        >>> await rt.aclose()

    Args:
        config: The runtime's settings.
        gateway_host: The host the trainer advertises for its gateway
            (``gateway.public_host`` or ``gateway.host``), checked at start.
    """

    kind = "agentcore"

    def __init__(self, config: AgentCoreRuntimeConfig, *, gateway_host: str = "") -> None:
        super().__init__()
        self.config = config
        self.gateway_host = gateway_host
        self.limiter: TpsLimiter | None = None
        self.acr: AcrClient | None = None
        self.exp_id = config.s3_exp_id
        self._channel: HttpResultChannel | S3ResultChannel | None = None
        self._sem = asyncio.Semaphore(max(1, config.max_concurrency))
        self._stops: set[asyncio.Task[Any]] = set()
        """Session stops under way (they outlive a cancelled rollout; ``aclose`` waits for them)."""

    @classmethod
    def from_config(cls, cfg: DictConfig) -> AgentCoreRuntime:
        """Build from the composed config (``core.config.TrainConfig``): ``cfg.runtime`` plus
        the advertised ``cfg.gateway`` host."""
        values = node_values(cfg.runtime, AgentCoreRuntimeConfig)
        return cls(AgentCoreRuntimeConfig(**values), gateway_host=advertised_gateway_host(cfg))

    # -- lifecycle --------------------------------------------------------------------

    def _validate(self) -> str:
        c = self.config
        if not c.agent_runtime_arn:
            raise ConfigError(
                "runtime.agent_runtime_arn is empty; set it to the ARN of your deployed agent "
                "(see docs/agentcore.md#deploying-an-agent)"
            )
        arn = parse_runtime_arn(c.agent_runtime_arn)
        if c.result_channel not in ("s3", "http"):
            raise ConfigError(f"runtime.result_channel must be 's3' or 'http', got {c.result_channel!r}")
        if c.result_channel == "s3" and not c.s3_bucket:
            raise ConfigError(
                "runtime.result_channel=s3 needs runtime.s3_bucket (the bucket the agent writes "
                "results to); or use runtime.result_channel=http"
            )
        if not c.tps_limit > 0 or not 0 < c.min_tps <= c.tps_limit:
            raise ConfigError(
                f"runtime.tps_limit must be > 0 and runtime.min_tps in (0, tps_limit], "
                f"got {c.tps_limit!r} and {c.min_tps!r}"
            )
        if not c.session_timeout > 0:
            raise ConfigError(f"runtime.session_timeout must be > 0, got {c.session_timeout!r}")
        if c.gateway_public_scheme not in ("", "http", "https"):
            raise ConfigError(
                f"runtime.gateway_public_scheme must be '', 'http' or 'https', got {c.gateway_public_scheme!r}"
            )
        return c.region or arn.region

    async def _start(self) -> None:
        """Check the config and the gateway's address, build the clients, check the bucket.

        Raises:
            ConfigError: a setting is wrong, or the gateway is advertised on a
                loopback address while agents run remotely.
            RuntimeStartError: the result bucket cannot be read.
        """
        c = self.config
        region = self._validate()
        host = c.gateway_public_host or self.gateway_host
        if host:
            where = "runtime.gateway_public_host" if c.gateway_public_host else "gateway.public_host/host"
            check_gateway_reachable(host, endpoint_url=c.endpoint_url, where=where)
        self.limiter = TpsLimiter(c.tps_limit, min_rate=c.min_tps)
        self.acr = AcrClient(
            arn=c.agent_runtime_arn,
            region=region,
            limiter=self.limiter,
            endpoint_url=c.endpoint_url or None,
            qualifier=c.qualifier or None,
            max_workers=max(8, c.max_concurrency + 8),
            read_timeout_s=max(c.read_timeout_s, c.http_wait_s + 30.0),
            cold_start_retries=c.cold_start_retries,
            cold_start_retry_delay_s=c.cold_start_retry_delay_s,
        )
        polling = Polling(c.poll_interval_s, c.max_poll_interval_s, c.poll_backoff)
        if c.result_channel == "s3":
            self.exp_id = c.s3_exp_id or f"tracerl-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            channel = S3ResultChannel(
                self.acr,
                bucket=c.s3_bucket,
                exp_id=self.exp_id,
                polling=polling,
                endpoint_url=c.s3_endpoint_url or None,
                region=region,
                max_workers=min(128, max(8, c.max_concurrency)),
            )
            self._channel = channel
            if c.check_bucket:
                try:
                    await channel.check_bucket()
                except Exception as exc:
                    await self._shutdown()
                    raise RuntimeStartError(
                        f"cannot read the result bucket {c.s3_bucket!r} ({exc}); create it in "
                        f"{region!r} and grant the trainer s3:GetObject and s3:ListBucket on it "
                        "(and the agent's execution role s3:PutObject)"
                    ) from exc
        else:
            self._channel = HttpResultChannel(self.acr, polling=polling, wait_s=c.http_wait_s)

    async def _settle(self) -> None:
        """Let cancelled rollouts schedule their session stops, and wait for the stops."""
        for _ in range(3):  # let cancelled rollouts reach their finally and schedule stops
            await asyncio.sleep(0)
        if self._stops:
            await asyncio.wait(list(self._stops), timeout=self.config.stop_timeout_s + 5.0)

    async def _shutdown(self) -> None:
        """Release the clients (and the S3 polling threads)."""
        if isinstance(self._channel, S3ResultChannel):
            self._channel.close()
        if self.acr is not None:
            self.acr.close()

    def stats(self) -> dict[str, float]:
        """Data-plane counters: attempts, throttling and cold-start retries, current rate."""
        out: dict[str, float] = {}
        if self.acr is not None:
            out.update({f"acr/{k}": float(v) for k, v in self.acr.counts.items()})
        if self.limiter is not None:
            out["acr/rate"] = self.limiter.rate
        return out

    # -- rollouts ---------------------------------------------------------------------

    def _payload(self, request: RolloutRequest, base_url: str) -> dict[str, Any]:
        return {
            **request.payload,
            "_config": {
                "base_url": base_url,
                "model_id": request.model_id,
                "api_key": request.session_id,
                "sampling_params": dict(request.sampling_params),
                "rollout_id": request.rollout_id,  # for a reward posted later
            },
        }

    async def _run(self, request: RolloutRequest, clock: RolloutClock) -> RolloutResult:
        """One rollout in its own AgentCore session, stopped afterwards; never raises for agent or AWS faults."""
        rid = request.rollout_id
        c = self.config
        assert self._channel is not None
        base_url = public_base_url(
            request.base_url,
            host=c.gateway_public_host,
            port=c.gateway_public_port,
            scheme=c.gateway_public_scheme,
        )
        try:
            check_gateway_reachable(
                urlsplit(base_url).hostname or "", endpoint_url=c.endpoint_url, where=base_url
            )
        except ConfigError as exc:
            return failed(rid, RolloutStatus.REJECTED, str(exc), 0.0)
        timeout = min(request.timeout_s, c.session_timeout)
        session: AcrSession | None = None
        try:
            async with self._sem:
                clock.restart()  # waiting for a slot is not the rollout's time
                session = AcrSession(
                    runtime_session_id=runtime_session_id(request),
                    invocation_id=uuid.uuid4().hex,
                    payload=self._payload(request, base_url),
                    group_id=request.group_id,
                    deadline=clock.t0 + timeout,
                )
                try:
                    async with asyncio.timeout(timeout):
                        output = await self._channel.run(session)
                except TimeoutError:
                    return failed(
                        rid,
                        RolloutStatus.TIMEOUT,
                        f"the rollout ran past its {timeout:g}s timeout; session "
                        f"{session.runtime_session_id!r} was stopped",
                        clock.elapsed(),
                    )
                except AgentFault as fault:
                    return failed(rid, fault.status, str(fault), clock.elapsed())
                except AcrCallError as exc:
                    status = RolloutStatus.REJECTED if exc.code in _REJECTED_CODES else RolloutStatus.CRASHED
                    return failed(rid, status, str(exc), clock.elapsed())
                return result_from_output(rid, output, clock.elapsed())
        finally:
            self._settled(rid)
            if session is not None and c.stop_sessions:
                await self._stop_after(session.runtime_session_id)

    async def _stop_after(self, session_id: str) -> None:
        """Stop the session; keeps going in the background if our caller is cancelled meanwhile."""
        stop = asyncio.create_task(self._stop(session_id), name=f"acr-stop-{session_id[:12]}")
        self._stops.add(stop)
        stop.add_done_callback(self._stops.discard)
        try:
            await asyncio.shield(stop)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    async def _stop(self, session_id: str) -> None:
        assert self.acr is not None
        try:
            await self.acr.stop(session_id, deadline=time.monotonic() + self.config.stop_timeout_s)
        except AcrCallError as exc:
            # Best effort: AgentCore ends idle sessions itself; say so rather than fail the rollout.
            logger.warning("could not stop AgentCore session %s: %s", session_id, exc)

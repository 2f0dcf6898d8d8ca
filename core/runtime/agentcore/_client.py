"""``AcrClient``: the boto3 ``bedrock-agentcore`` data plane, async, rate limited, retried.

Defines ``AcrClient`` and ``AcrCallError``. boto3 is imported when a client is
built, never at module import. Every boto3 call is blocking, so it runs in a
bounded thread pool and the event loop stays free. All retries are ours
(botocore's are switched off) so that every attempt passes through the one
``TpsLimiter`` and is counted:

- throttling (``ThrottlingException``, HTTP 429, ``ServiceQuotaExceededException``
  and the retryable 409) is retried with jittered backoff until the caller's
  deadline, the limiter halving its rate on each one;
- ``RuntimeClientError`` (424), what AgentCore answers while a new session's
  container is not serving yet, is retried ``cold_start_retries`` times;
- everything else is raised as ``AcrCallError`` at once.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from core.errors import RuntimeStartError
from core.runtime.agentcore._limiter import TpsLimiter

_OLD_BOTO3 = (
    "boto3 {version} lacks the bedrock-agentcore InvokeAgentRuntime/StopRuntimeSession "
    "operations; upgrade it: pip install -U boto3"
)

_NO_CREDENTIALS = (
    "boto3 found no AWS credentials for the AgentCore data plane ({endpoint}). Against AWS, "
    "configure them as for the aws CLI (AWS_PROFILE, `aws configure`, an instance role). "
    "Against the local stand-in (python -m core.testing.agentcore_standin) any will do, since it "
    "checks no signature: AWS_ACCESS_KEY_ID=standin AWS_SECRET_ACCESS_KEY=standin "
    "python -m core.train ... (docs/agentcore.md)"
)

THROTTLE_CODES = frozenset(
    {
        "ThrottlingException",
        "TooManyRequestsException",
        "ServiceQuotaExceededException",
        "RetryableConflictException",
    }
)
"""Error codes that mean "slow down and try again"."""

COLD_START_CODES = frozenset({"RuntimeClientError"})
"""Error codes a container gives before it serves (retried a bounded number of times)."""


class AcrCallError(Exception):
    """A data-plane call failed for good; ``code`` is AWS's error code (or the exception name)."""

    def __init__(self, message: str, *, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self), self.code, self.status))


def _rebuild(message: str, code: str, status: int) -> AcrCallError:
    return AcrCallError(message, code=code, status=status)


class AcrClient:
    """Async wrapper over boto3's ``bedrock-agentcore`` client for one runtime ARN.

    Args:
        arn: The runtime ARN.
        region: Region of the data plane.
        limiter: The limiter every call goes through.
        endpoint_url: Endpoint override (a local stand-in); None is AWS.
        qualifier: Runtime endpoint name; None is ``DEFAULT``.
        max_workers: Threads (and pooled connections) for concurrent calls.
        read_timeout_s: botocore read timeout.
        cold_start_retries: Retries of ``RuntimeClientError``.
        cold_start_retry_delay_s: Wait before each of those retries.
    """

    def __init__(
        self,
        *,
        arn: str,
        region: str,
        limiter: TpsLimiter,
        endpoint_url: str | None = None,
        qualifier: str | None = None,
        max_workers: int = 256,
        read_timeout_s: float = 120.0,
        cold_start_retries: int = 3,
        cold_start_retry_delay_s: float = 2.0,
    ) -> None:
        import boto3  # lazy: core.runtime must import without the aws extra
        from botocore.config import Config
        from botocore.exceptions import UnknownServiceError

        self.arn = arn
        self.limiter = limiter
        self.qualifier = qualifier or None
        self.cold_start_retries = cold_start_retries
        self.cold_start_retry_delay_s = cold_start_retry_delay_s
        self.counts: dict[str, int] = {"invoke": 0, "stop": 0, "throttled": 0, "cold_start": 0}
        """Attempts made and retries taken, for metrics and tests."""
        session = boto3.session.Session()
        if session.get_credentials() is None:
            raise RuntimeStartError(_NO_CREDENTIALS.format(endpoint=endpoint_url or "AWS"))
        try:
            self._client = session.client(
                "bedrock-agentcore",
                region_name=region,
                endpoint_url=endpoint_url,
                config=Config(
                    retries={"mode": "standard", "total_max_attempts": 1},
                    max_pool_connections=max_workers,
                    read_timeout=read_timeout_s,
                    connect_timeout=10,
                    user_agent_extra="tracerl",
                ),
            )
        except UnknownServiceError as exc:
            raise RuntimeStartError(_OLD_BOTO3.format(version=boto3.__version__)) from exc
        if not hasattr(self._client, "stop_runtime_session"):
            raise RuntimeStartError(_OLD_BOTO3.format(version=boto3.__version__))
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="acr")

    async def _in_thread(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _call(self, what: str, fn: Callable[[], Any], *, deadline: float) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        throttled = cold = 0
        while True:
            await self.limiter.acquire()
            self.counts[what] += 1
            try:
                result = await self._in_thread(fn)
            except ClientError as exc:
                err = exc.response.get("Error", {})
                code = str(err.get("Code", ""))
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
                message = str(err.get("Message", "")) or str(exc)
                if code in THROTTLE_CODES or status == 429:
                    self.limiter.on_throttle()
                    self.counts["throttled"] += 1
                    throttled += 1
                    delay = min(5.0, 0.1 * 2 ** min(throttled, 6)) * (0.5 + random.random())
                    if time.monotonic() + delay >= deadline:
                        raise AcrCallError(
                            f"{what}: still throttled ({code or status}) after {throttled} "
                            f"retries when the rollout's deadline came: {message}; "
                            "lower runtime.tps_limit or ask AWS for a higher quota",
                            code=code,
                            status=status,
                        ) from exc
                    await asyncio.sleep(delay)
                    continue
                if code in COLD_START_CODES and cold < self.cold_start_retries:
                    cold += 1
                    self.counts["cold_start"] += 1
                    await asyncio.sleep(self.cold_start_retry_delay_s)
                    continue
                raise AcrCallError(
                    f"{what} failed with {code or 'HTTP ' + str(status)}: {message}",
                    code=code,
                    status=status,
                ) from exc
            except BotoCoreError as exc:
                raise AcrCallError(
                    f"{what} could not reach the AgentCore data plane: {exc}",
                    code=type(exc).__name__,
                ) from exc
            self.limiter.on_success()
            return result

    async def invoke(self, session_id: str, payload: dict[str, Any], *, deadline: float) -> Any:
        """InvokeAgentRuntime with a JSON payload; returns the agent's reply, parsed as JSON.

        Raises:
            AcrCallError: the call failed for good (after the retries described above).
        """
        body = json.dumps(payload).encode()
        kwargs: dict[str, Any] = {
            "agentRuntimeArn": self.arn,
            "runtimeSessionId": session_id,
            "payload": body,
            "contentType": "application/json",
            "accept": "application/json",
        }
        if self.qualifier:
            kwargs["qualifier"] = self.qualifier

        def call() -> bytes:
            response = self._client.invoke_agent_runtime(**kwargs)
            stream = response["response"]
            try:
                return bytes(stream.read())
            finally:
                stream.close()

        raw = await self._call("invoke", call, deadline=deadline)
        try:
            return json.loads(raw) if raw else None
        except ValueError as exc:
            raise AcrCallError(
                f"the agent's reply is not JSON: {raw[:300]!r}", code="NotJson"
            ) from exc

    async def stop(self, session_id: str, *, deadline: float) -> bool:
        """StopRuntimeSession; True if stopped, False if AgentCore no longer knows the session.

        Raises:
            AcrCallError: the call failed for another reason.
        """
        kwargs: dict[str, Any] = {"agentRuntimeArn": self.arn, "runtimeSessionId": session_id}
        if self.qualifier:
            kwargs["qualifier"] = self.qualifier
        try:
            await self._call("stop", lambda: self._client.stop_runtime_session(**kwargs), deadline=deadline)
        except AcrCallError as exc:
            if exc.code == "ResourceNotFoundException" or exc.status == 404:
                return False
            raise
        return True

    def close(self) -> None:
        """Release the threads and connections; calls in flight finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

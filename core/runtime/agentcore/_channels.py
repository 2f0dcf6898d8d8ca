"""How one rollout's result comes back from an AgentCore session.

Defines ``AcrSession`` (what a channel needs for one rollout),
``HttpResultChannel`` (start/get invocations through InvokeAgentRuntime, the
``AgentCoreRuntimeApp`` contract) and ``S3ResultChannel`` (fire with ``_rollout``
S3 fields, then HEAD/GET-poll the object, the ``AgentCoreRLApp`` contract).

A channel returns the handler's output dict; turning it into a reward is
``core.runtime._results``' job, shared with the local runtime. The start/get
polling loop and the result read are ``core.runtime._channels``', shared too.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from core.agent._protocol import ENVELOPE_KEY, ROLLOUT_KEY, InvocationOp, s3_result_key
from core.runtime._channels import (
    MISSING_OBJECT_CODES,
    AgentFault,
    Polling,
    check_result_key,
    follow_invocation,
    read_json_object,
)
from core.runtime.agentcore._client import AcrClient
from core.types import RolloutStatus


@dataclass
class AcrSession:
    """One rollout's AgentCore session."""

    runtime_session_id: str
    """``runtimeSessionId`` (>= 33 characters)."""
    invocation_id: str
    """Id of the start/get invocation (``http`` channel)."""
    payload: dict[str, Any]
    """Dataset row plus ``_config``."""
    group_id: str
    """GRPO group; the toolkit's ``input_id``."""
    deadline: float
    """``time.monotonic()`` by which the rollout must be done."""


class HttpResultChannel:
    """``AgentCoreRuntimeApp``'s start/get protocol, every call an InvokeAgentRuntime.

    Every get spends one slot of the runtime's TPS budget, so polls back off;
    a tracerl agent (``core.agent.AgentApp``, which marks its replies) is
    long-polled instead: each get waits up to ``wait_s`` for completion.
    """

    def __init__(self, acr: AcrClient, *, polling: Polling, wait_s: float = 10.0) -> None:
        self.acr = acr
        self.polling = polling
        self.wait_s = wait_s

    async def run(self, s: AcrSession) -> Any:
        """Start the invocation in the background and return the handler's output.

        Raises:
            AgentFault: the handler failed or the session lost the invocation.
            AcrCallError: a data-plane call failed for good.
        """
        start = InvocationOp("start", s.invocation_id, background=True)
        state = await self.acr.invoke(
            s.runtime_session_id, {**s.payload, ENVELOPE_KEY: start.to_envelope()}, deadline=s.deadline
        )

        async def get(op: InvocationOp) -> Any:
            return await self.acr.invoke(
                s.runtime_session_id, {ENVELOPE_KEY: op.to_envelope()}, deadline=s.deadline
            )

        def long_poll_s() -> float:
            return max(0.0, min(self.wait_s, s.deadline - time.monotonic()))

        return await follow_invocation(
            state,
            s.invocation_id,
            get,
            polling=self.polling,
            long_poll_s=long_poll_s if self.wait_s > 0 else None,
            lost="the session lost the invocation (state {state}): its microVM was replaced or "
            "the agent process restarted mid-rollout",
        )


class S3ResultChannel:
    """``AgentCoreRLApp``'s contract: the agent saves ``{exp_id}/{input_id}/{session}.json``.

    The trainer reads that key only; a reply naming another ``result_key`` fails the rollout.

    Args:
        acr: The data-plane client.
        bucket: Result bucket.
        exp_id: Key prefix of this run.
        polling: HEAD backoff.
        endpoint_url: S3 endpoint override; None is AWS.
        region: Region for the S3 client.
        max_workers: Threads for concurrent HEAD/GET calls.
    """

    def __init__(
        self,
        acr: AcrClient,
        *,
        bucket: str,
        exp_id: str,
        polling: Polling,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_workers: int = 64,
    ) -> None:
        import boto3  # lazy: see core.runtime.agentcore._client
        from botocore.config import Config

        self.acr = acr
        self.bucket = bucket
        self.exp_id = exp_id
        self.polling = polling
        self._s3 = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=Config(max_pool_connections=max_workers, retries={"mode": "standard"}),
        )
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="acr-s3")

    async def _call(self, fn: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(**kwargs))

    async def check_bucket(self) -> None:
        """HEAD the bucket.

        Raises:
            botocore.exceptions.ClientError: it is missing or we may not read it.
        """
        await self._call(self._s3.head_bucket, Bucket=self.bucket)

    async def run(self, s: AcrSession) -> Any:
        """Invoke with ``_rollout`` S3 fields, then poll the result object.

        Raises:
            AgentFault: S3 refused the reads or the object is not JSON.
            AcrCallError: the invocation failed for good.
        """
        from botocore.exceptions import ClientError

        cfg = s.payload.get("_config", {})
        rollout = {
            "exp_id": self.exp_id,
            "input_id": s.group_id,
            "s3_bucket": self.bucket,
            **{k: cfg[k] for k in ("base_url", "model_id", "api_key", "sampling_params") if k in cfg},
        }
        reply = await self.acr.invoke(
            s.runtime_session_id, {**s.payload, ROLLOUT_KEY: rollout}, deadline=s.deadline
        )
        key = s3_result_key(self.exp_id, s.group_id, s.runtime_session_id)
        check_result_key(reply, self.bucket, key)
        delay = self.polling.initial_s
        while True:
            try:
                await self._call(self._s3.head_object, Bucket=self.bucket, Key=key)
                break
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in ("403", "AccessDenied", "Forbidden"):
                    raise AgentFault(
                        RolloutStatus.CRASHED,
                        f"S3 HEAD s3://{self.bucket}/{key} was denied (403). Without s3:ListBucket "
                        "a missing object answers 403, not 404: grant the trainer s3:GetObject and "
                        "s3:ListBucket on the bucket",
                    ) from exc
                if code not in MISSING_OBJECT_CODES:
                    raise AgentFault(
                        RolloutStatus.CRASHED, f"S3 HEAD s3://{self.bucket}/{key} failed: {exc}"
                    ) from exc
            await asyncio.sleep(max(0.0, min(delay, s.deadline - time.monotonic())))
            delay = self.polling.next(delay)
        return await read_json_object(self._call, self._s3, self.bucket, key)

    def close(self) -> None:
        """Release the polling threads and the S3 client."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._s3.close()

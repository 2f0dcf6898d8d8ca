"""How a runtime starts one invocation on an agent server and gets its output back.

Defines:

- ``AgentFault``: an agent-side failure carrying the ``RolloutStatus`` it maps to.
- ``Polling`` and ``follow_invocation``: the start/get polling loop, shared with
  the agentcore runtime's channels (only the transport of a get differs).
- ``HttpChannel``: the start/get protocol over ``POST /invocations``; long-polls
  (``wait_s``) and cancels when the server is a ``core.agent.AgentApp``, plain
  polling with backoff for other servers of the protocol.
- ``S3Channel``: agentcore-rl-toolkit's ``AgentCoreRLApp`` contract: fire with
  ``_rollout`` S3 fields, poll the result object with boto3 (imported lazily).
- ``check_result_key``: both S3 channels read the key the trainer chose, never
  one an agent names; ``read_json_object`` reads that result.

A channel returns the handler's output dict; mapping it to a reward is
``core.runtime._results``' job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from core.agent._protocol import (
    ENVELOPE_KEY,
    ROLLOUT_KEY,
    SERVER_MARKER,
    SESSION_HEADER,
    InvocationOp,
    result_session_id,
    s3_result_key,
)
from core.http import FastResponse, HTTPClient
from core.runtime._process import AgentProcess
from core.types import RolloutStatus

LONG_POLL_S = 10.0
"""Longest single ``get`` wait; short enough that a dead connection shows up fast."""

MISSING_OBJECT_CODES = ("404", "NoSuchKey", "NotFound")
"""S3 error codes of a result object not written yet (keep polling)."""


class AgentFault(Exception):
    """The agent failed in a way that maps to ``status``; the message is the error text."""

    def __init__(self, status: RolloutStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Invocation:
    """What a channel needs to run one rollout on one process."""

    proc: AgentProcess
    """Process serving it."""
    generation: int
    """``proc.generation`` when it started; a change means the process was replaced."""
    session_id: str
    """Runtime session id (also the gateway session id)."""
    invocation_id: str
    """Id within the session."""
    payload: dict[str, Any]
    """Full payload, ``_config`` included."""
    group_id: str
    """GRPO group (the toolkit's ``input_id``)."""
    remote_id: str = ""
    """The agent's own id for the invocation when it can be cancelled (S3 channel)."""
    pid: int | None = None
    """``proc.pid`` when it started: named in the error if the process dies and is restarted
    before the rollout learns of it (then ``proc.pid`` is the new process's)."""


@dataclass(frozen=True)
class Polling:
    """Backoff of result polls."""

    initial_s: float = 0.5
    """First wait."""
    max_s: float = 10.0
    """Longest wait."""
    factor: float = 1.5
    """Growth per poll."""

    def next(self, delay: float) -> float:
        """The wait after ``delay``."""
        return min(delay * self.factor, self.max_s)


def _is_state_of(reply: Any, invocation_id: str) -> bool:
    """True when ``reply`` is the start/get state of that invocation (not a handler's output)."""
    return isinstance(reply, dict) and reply.get("invocation_id") == invocation_id


async def follow_invocation(
    state: Any,
    invocation_id: str,
    get: Callable[[InvocationOp], Awaitable[Any]],
    *,
    polling: Polling,
    long_poll_s: Callable[[], float] | None,
    lost: str,
) -> Any:
    """The handler's output, once the invocation whose start answered ``state`` completes.

    A reply that is not the invocation's state comes from a server without the
    start/get protocol: it is the output itself. A server that marks its replies
    (``core.agent``) is long-polled, each get waiting ``long_poll_s()``; others
    (and every server when ``long_poll_s`` is None) are polled with ``polling``'s
    backoff. ``get`` sends one get and returns the reply.

    Args:
        lost: The error when the invocation is gone; ``{state}`` stands for its last state.

    Raises:
        AgentFault: ``CRASHED``: a get answered with no state, the handler failed,
            or the invocation was lost.
    """
    if not _is_state_of(state, invocation_id):
        return state
    ours = bool(state.get(SERVER_MARKER))
    delay = polling.initial_s
    while state.get("status") == "in_progress":
        if ours and long_poll_s is not None:
            op = InvocationOp("get", invocation_id, wait_s=long_poll_s())
        else:
            await asyncio.sleep(delay)
            delay = polling.next(delay)
            op = InvocationOp("get", invocation_id)
        state = await get(op)
        if not isinstance(state, dict):
            raise AgentFault(
                RolloutStatus.CRASHED, f"the agent answered a get with {state!r:.300}, not a state"
            )
    status = state.get("status")
    if status != "completed":
        raise AgentFault(RolloutStatus.CRASHED, lost.format(state=repr(status)))
    if "error" in state:
        raise AgentFault(RolloutStatus.CRASHED, str(state["error"]))
    return state.get("result")


async def read_json_object(
    call: Callable[..., Awaitable[Any]], s3: Any, bucket: str, key: str
) -> Any:
    """The JSON result object at ``s3://bucket/key``, read through ``call`` (an executor).

    Raises:
        AgentFault: ``CRASHED``: the object is not JSON.
    """
    obj = await call(s3.get_object, Bucket=bucket, Key=key)
    body = await call(obj["Body"].read)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise AgentFault(
            RolloutStatus.CRASHED, f"s3://{bucket}/{key} is not JSON: {body[:200]!r}"
        ) from exc


def _check_reply(r: httpx.Response | FastResponse, what: str) -> Any:
    if r.status_code == 400:
        raise AgentFault(RolloutStatus.REJECTED, f"the agent rejected the {what}: {r.text[:2000]}")
    if r.status_code != 200:
        raise AgentFault(
            RolloutStatus.CRASHED,
            f"the agent answered the {what} with HTTP {r.status_code}: {r.text[:4000]}",
        )
    try:
        return r.json()
    except ValueError as exc:
        raise AgentFault(
            RolloutStatus.CRASHED, f"the agent's reply to the {what} is not JSON: {r.text[:500]!r}"
        ) from exc


def check_result_key(reply: Any, bucket: str, key: str) -> None:
    """Refuse a reply naming a result key other than the one the trainer chose.

    The trainer reads ``{exp_id}/{group}/{session}.json`` and nothing else: were an
    agent's ``result_key`` followed, one rollout could hand in another's result.

    Raises:
        AgentFault: ``CRASHED``, naming both keys.
    """
    if not isinstance(reply, dict) or "result_key" not in reply:
        return
    named = reply["result_key"]
    if named != key or reply.get("s3_bucket", bucket) != bucket:
        raise AgentFault(
            RolloutStatus.CRASHED,
            f"the agent says it saves its result at s3://{reply.get('s3_bucket', bucket)}/"
            f"{named!r:.300}, but the trainer reads only s3://{bucket}/{key} "
            "({exp_id}/{input_id}/{session_id}.json from the payload's _rollout fields and the "
            "session header); results under any other key are refused. Let the agent derive "
            "the key from those (core.agent and agentcore-rl-toolkit apps do)",
        )


class HttpChannel:
    """Start/get polling over HTTP (AgentCore Runtime's ``_agentcore_runtime`` envelope)."""

    def __init__(
        self, client: HTTPClient, *, poll_interval_s: float = 0.05, max_poll_s: float = 1.0
    ) -> None:
        self.client = client
        self.polling = Polling(poll_interval_s, max_poll_s, 1.5)

    async def _post(
        self, inv: Invocation, body: dict[str, Any], timeout: float
    ) -> httpx.Response | FastResponse:
        return await self.client.post(
            f"{inv.proc.base_url}/invocations",
            content=json.dumps(body),
            headers={
                SESSION_HEADER: inv.session_id,
                "content-type": "application/json",
                **inv.proc.auth_headers,
            },
            timeout=timeout,
        )

    async def run(self, inv: Invocation) -> Any:
        """Start the invocation in the background and return the handler's output.

        Raises:
            AgentFault: the handler failed, the agent refused the payload, or the
                process lost the invocation (it was restarted).
            httpx.TransportError: the process could not be reached.
        """
        # Once a process has shown it is a core.agent server, start and long-poll in one
        # request (half the HTTP work per rollout); other servers would reject wait_s.
        known = inv.proc.speaks_tracerl
        start = InvocationOp(
            "start", inv.invocation_id, background=True, wait_s=LONG_POLL_S if known else 0.0
        )
        state = _check_reply(
            await self._post(
                inv, {**inv.payload, ENVELOPE_KEY: start.to_envelope()}, LONG_POLL_S + 30.0
            ),
            "start request",
        )
        if _is_state_of(state, inv.invocation_id):
            inv.proc.speaks_tracerl = bool(state.get(SERVER_MARKER))

        async def get(op: InvocationOp) -> Any:
            r = await self._post(inv, {ENVELOPE_KEY: op.to_envelope()}, LONG_POLL_S + 30.0)
            return _check_reply(r, "get request")

        return await follow_invocation(
            state,
            inv.invocation_id,
            get,
            polling=self.polling,
            long_poll_s=lambda: LONG_POLL_S,
            lost="the agent process lost the invocation (state {state}): it was restarted "
            "or crashed mid-rollout",
        )

    async def cancel(self, inv: Invocation) -> None:
        """Ask the agent to cancel the invocation; best effort, errors ignored."""
        op = InvocationOp("cancel", inv.invocation_id)
        try:
            await self._post(inv, {ENVELOPE_KEY: op.to_envelope()}, 5.0)
        except httpx.HTTPError:
            pass


class S3Channel:
    """agentcore-rl-toolkit's S3 contract: the agent saves its result, we poll for the object."""

    def __init__(
        self,
        client: HTTPClient,
        *,
        bucket: str,
        exp_id: str,
        endpoint_url: str = "",
        poll_interval_s: float = 0.1,
        max_poll_s: float = 1.0,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.exp_id = exp_id
        self.endpoint_url = endpoint_url or None
        self.poll_interval_s = poll_interval_s
        self.max_poll_s = max_poll_s
        self._s3: Any = None
        self._pool = ThreadPoolExecutor(32, thread_name_prefix="s3-poll")

    def _client(self) -> Any:
        if self._s3 is None:
            import boto3  # lazy: only the S3 channel needs it

            self._s3 = boto3.client("s3", endpoint_url=self.endpoint_url)
        return self._s3

    async def _call(self, fn: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(**kwargs))

    async def run(self, inv: Invocation) -> Any:
        """Fire the invocation with ``_rollout`` S3 fields and wait for the result object.

        Raises:
            AgentFault: the agent refused it, or its process died before saving a result.
            httpx.TransportError: the process could not be reached.
        """
        from botocore.exceptions import ClientError

        s3 = self._client()
        rollout = {
            **inv.payload.get(ROLLOUT_KEY, {}),
            "exp_id": self.exp_id,
            "input_id": inv.group_id,
            "s3_bucket": self.bucket,
        }
        r = await self.client.post(
            f"{inv.proc.base_url}/invocations",
            content=json.dumps({**inv.payload, ROLLOUT_KEY: rollout}),
            headers={
                SESSION_HEADER: result_session_id(inv.session_id),
                "content-type": "application/json",
                **inv.proc.auth_headers,
            },
            timeout=30.0,
        )
        reply = _check_reply(r, "rollout request")
        key = s3_result_key(self.exp_id, inv.group_id, result_session_id(inv.session_id))
        check_result_key(reply, self.bucket, key)
        if isinstance(reply, dict) and reply.get(SERVER_MARKER):
            inv.remote_id = str(reply.get("invocation_id") or "")
        delay = self.poll_interval_s
        while True:
            try:
                await self._call(s3.head_object, Bucket=self.bucket, Key=key)
                break
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in MISSING_OBJECT_CODES:
                    raise AgentFault(
                        RolloutStatus.CRASHED, f"S3 head_object {key!r} failed: {exc}"
                    ) from exc
            if not inv.proc.alive() or inv.proc.generation != inv.generation:
                raise AgentFault(
                    RolloutStatus.CRASHED,
                    f"the agent process exited before saving s3://{self.bucket}/{key}",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, self.max_poll_s)
        return await read_json_object(self._call, s3, self.bucket, key)

    async def cancel(self, inv: Invocation) -> None:
        """Cancel a ``core.agent`` invocation by its id; the toolkit's app has no cancel (best effort)."""
        if not inv.remote_id or inv.generation != inv.proc.generation:
            return
        op = InvocationOp("cancel", inv.remote_id)
        with contextlib.suppress(httpx.HTTPError):  # the process may be gone already
            await self.client.post(
                f"{inv.proc.base_url}/invocations",
                content=json.dumps({ENVELOPE_KEY: op.to_envelope()}),
                headers={
                    SESSION_HEADER: result_session_id(inv.session_id),
                    "content-type": "application/json",
                    **inv.proc.auth_headers,
                },
                timeout=5.0,
            )

    def close(self) -> None:
        """Release the polling threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

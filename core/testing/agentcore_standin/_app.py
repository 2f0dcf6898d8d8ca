"""``AcrStandIn``: a local stand-in for the AgentCore Runtime data plane.

Serves the two operations tracerl uses, at the paths and headers of botocore's
``bedrock-agentcore`` service model, so the real boto3 client runs against it
with ``endpoint_url`` pointed here:

- ``POST /runtimes/{agentRuntimeArn}/invocations`` (InvokeAgentRuntime): the
  session header ``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`` names the
  session; a new session gets its own agent (a ``python -m core.agent`` process,
  as a microVM would), and the body is forwarded to its ``POST /invocations``.
- ``POST /runtimes/{agentRuntimeArn}/stopruntimesession`` (StopRuntimeSession):
  the session's agent is killed.

Errors use AWS's rest-json shape (``x-amzn-ErrorType`` header, ``message`` body)
and the service model's status codes, so botocore raises the same
``ClientError`` codes it would against AWS. Sessions nobody stops (a stop that
was throttled away, an invoke that arrived after its session's stop) end the
way AgentCore ends them: after ``idle_timeout_s`` without an invocation while
the agent's ``/ping`` does not say ``HealthyBusy``; ``max_sessions`` caps the
agents alive at once (``ServiceQuotaExceededException`` beyond it). Knobs inject the faults a trainer
must survive: throttling for a while (429), a per-ARN TPS limit, and
``RuntimeClientError`` (424) for a new session's first invocations, which is
how AgentCore reports a container that is not serving yet. Every call is
recorded in ``calls``.

What it does not model: IAM/SigV4 (signatures are not checked), streaming
responses, MCP/A2A protocols, microVM isolation beyond one process per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.agent._auth import TOKEN_HEADER
from core.agent._protocol import SESSION_HEADER
from core.runtime._process import AgentProcess

MIN_SESSION_ID = 33
"""AgentCore's minimum ``runtimeSessionId`` length."""


@dataclass(frozen=True)
class CallRecord:
    """One data-plane call the stand-in answered."""

    op: str
    """``invoke`` or ``stop``."""
    session_id: str
    """The ``runtimeSessionId``."""
    t: float
    """``time.monotonic()`` when the request arrived."""
    status: int
    """HTTP status answered."""


@dataclass
class _Session:
    session_id: str
    ready: asyncio.Future[str]
    proc: AgentProcess | None = None
    invocations: int = 0
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)


class _QuotaExceeded(Exception):
    """A new session would exceed ``max_sessions``."""


def _aws_error(code: str, message: str, status: int) -> JSONResponse:
    return JSONResponse(
        {"message": message, "__type": code}, status_code=status, headers={"x-amzn-ErrorType": code}
    )


class AcrStandIn:
    """The data-plane stand-in as an ASGI app (serve it with ``StandInServer`` or uvicorn).

    Exactly one of ``agent``, ``agent_url`` and ``app`` says where sessions run.

    Args:
        agent: ``module:attr`` of an agent app; each session gets its own process.
        agent_url: Base URL of an agent already listening (e.g. a container run
            with ``docker run -p 8080:8080``); all sessions share it.
        agent_token: Invocation token that agent demands (``$TRACERL_AGENT_TOKEN``
            in its environment), sent as ``X-Tracerl-Agent-Token``. Agent
            processes the stand-in starts get a fresh token each.
        app: An ASGI agent app served in this process (fast; for tests).
        arn: Only this runtime ARN is served (404 for others); empty serves any.
        env: Extra environment for agent processes (e.g. ``AWS_ENDPOINT_URL_S3``).
        workdir: Folder for process logs; empty makes a temporary one.
        startup_timeout_s: How long a session's agent may take to answer ``/ping``.
        tps_limit: Calls per second before answering 429, like AgentCore's
            per-ARN quota (a token bucket holding one second's worth); 0 is off.
        cold_start_failures: Invocations of each new session answered with
            ``RuntimeClientError`` before it serves.
        idle_timeout_s: A session with no invocation in flight for this long is
            stopped unless its agent's ``/ping`` says ``HealthyBusy`` (AgentCore's
            rule; its default is 15 minutes, the command line's is 60 s so sessions
            whose stop never came do not pile up as processes).
        max_sessions: Most sessions alive at once; a new one beyond it is answered
            ``ServiceQuotaExceededException`` (402; the trainer retries it as
            throttling). 0 is no cap.
    """

    def __init__(
        self,
        *,
        agent: str = "",
        agent_url: str = "",
        agent_token: str = "",
        app: Any = None,
        arn: str = "",
        env: dict[str, str] | None = None,
        workdir: str | Path = "",
        startup_timeout_s: float = 60.0,
        tps_limit: float = 0.0,
        cold_start_failures: int = 0,
        idle_timeout_s: float = 900.0,
        max_sessions: int = 0,
    ) -> None:
        if sum(bool(x) for x in (agent, agent_url, app is not None)) != 1:
            raise ValueError("give exactly one of agent='module:attr', agent_url=... or app=...")
        self.agent = agent
        self.agent_url = agent_url.rstrip("/")
        self.agent_token = agent_token
        self.agent_app = app
        self.arn = arn
        self.env = dict(env or {})
        self._workdir = Path(workdir) if workdir else None
        self.startup_timeout_s = startup_timeout_s
        self.tps_limit = tps_limit
        self.cold_start_failures = cold_start_failures
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self.reaped: list[str] = []
        """Sessions ended by the idle rule (nobody stopped them), in order."""
        self.calls: list[CallRecord] = []
        """Every call answered, in arrival order."""
        self.sessions: dict[str, _Session] = {}
        self._throttle_until = 0.0
        self._tokens = max(1.0, tps_limit)
        self._refilled = time.monotonic()
        self._lock = threading.Lock()
        self._index = 0
        self._client: httpx.AsyncClient | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.asgi = Starlette(
            routes=[
                Route("/runtimes/{arn:path}/invocations", self._invoke, methods=["POST"]),
                Route("/runtimes/{arn:path}/stopruntimesession", self._stop, methods=["POST"]),
                Route("/ping", self._ping, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.asgi(scope, receive, send)

    # -- knobs and records ------------------------------------------------------------

    def throttle_for(self, seconds: float) -> None:
        """Answer every call with ``ThrottlingException`` (429) for the next ``seconds``."""
        self._throttle_until = time.monotonic() + seconds

    def stopped_sessions(self) -> list[str]:
        """Sessions a StopRuntimeSession was accepted for, in order."""
        return [c.session_id for c in self.calls if c.op == "stop" and c.status == 200]

    def accepted(self, op: str | None = None) -> list[CallRecord]:
        """Calls not throttled (optionally of one ``op``)."""
        return [c for c in self.calls if c.status != 429 and (op is None or c.op == op)]

    def _throttled(self, now: float) -> bool:
        if now < self._throttle_until:
            return True
        if self.tps_limit <= 0:
            return False
        with self._lock:
            self._tokens = min(
                max(1.0, self.tps_limit), self._tokens + (now - self._refilled) * self.tps_limit
            )
            self._refilled = now
            if self._tokens < 1.0:
                return True
            self._tokens -= 1.0
            return False

    # -- lifecycle --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        transport = httpx.ASGITransport(app=self.agent_app) if self.agent_app is not None else None
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(900.0, connect=10.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
            trust_env=False,
        )
        if self.agent and self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tracerl-acr-standin-")
            self._workdir = Path(self._tmp.name)
        self._reaper = asyncio.create_task(self._reap())
        try:
            yield
        finally:
            self._reaper.cancel()
            await asyncio.gather(
                *(self._end(s) for s in list(self.sessions.values())), return_exceptions=True
            )
            await self._client.aclose()
            if self._tmp is not None:
                self._tmp.cleanup()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout_s / 4))
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if s.proc is not None and s.ready.done() and not s.proc.alive():
                    self.sessions.pop(s.session_id, None)  # the agent exited on its own
                    continue
                if s.in_flight or not s.ready.done() or now - s.last_used <= self.idle_timeout_s:
                    continue
                if await self._busy(s):
                    s.last_used = time.monotonic()  # still working (e.g. an S3-channel rollout)
                    continue
                if self.sessions.get(s.session_id) is s and not s.in_flight:
                    self.sessions.pop(s.session_id, None)
                    self.reaped.append(s.session_id)
                    await self._end(s)

    async def _busy(self, s: _Session) -> bool:
        """Whether the session's agent says ``HealthyBusy`` (work running after its invocation
        returned); an agent that does not answer is not busy."""
        if s.proc is None or self._client is None:
            return False
        try:
            r = await self._client.get(
                f"{s.proc.base_url}/ping", headers=s.proc.auth_headers, timeout=5.0
            )
            return bool(r.status_code == 200 and r.json().get("status") == "HealthyBusy")
        except (httpx.HTTPError, ValueError):
            return False

    async def _end(self, s: _Session) -> None:
        if not s.ready.done():
            s.ready.cancel()
        if s.proc is not None:
            await s.proc.stop()

    async def _session(self, session_id: str) -> tuple[_Session, str]:
        """The session's agent base URL, starting its agent on first use."""
        s = self.sessions.get(session_id)
        if s is None:
            if self.max_sessions and len(self.sessions) >= self.max_sessions:
                raise _QuotaExceeded(
                    f"{len(self.sessions)} sessions are alive, the stand-in's --max-sessions is "
                    f"{self.max_sessions}; stop sessions or lower runtime.max_concurrency"
                )
            s = _Session(session_id, asyncio.get_running_loop().create_future())
            self.sessions[session_id] = s
            if self.agent:
                assert self._workdir is not None and self._client is not None
                self._index += 1
                s.proc = AgentProcess(self._index, self.agent, self._workdir, env=self.env)
                s.proc.spawn()
                try:
                    await s.proc.wait_ready(self._client, self.startup_timeout_s)
                except Exception as exc:
                    if self.sessions.get(session_id) is s:
                        self.sessions.pop(session_id)
                    if not s.ready.done():  # a stop during start-up cancelled it already
                        s.ready.set_exception(exc)
                        s.ready.exception()  # retrieved: concurrent waiters re-raise it themselves
                    await s.proc.stop()
                    raise
                if s.ready.done():  # stopped while its agent started: _end cancelled it
                    await s.proc.stop()
                    raise RuntimeError("the session was stopped while its agent started")
                s.ready.set_result(s.proc.base_url)
            else:
                s.ready.set_result(self.agent_url or "http://agent")
        s.last_used = time.monotonic()
        return s, await asyncio.shield(s.ready)

    # -- routes -----------------------------------------------------------------------

    def _check(self, request: Request, op: str, now: float) -> tuple[str, Response | None]:
        session_id = request.headers.get(SESSION_HEADER, "")
        arn = unquote(request.path_params["arn"])
        if self.arn and arn != self.arn:
            return session_id, _aws_error(
                "ResourceNotFoundException", f"No agent runtime found for {arn!r}", 404
            )
        if len(session_id) < MIN_SESSION_ID:
            return session_id, _aws_error(
                "ValidationException",
                f"runtimeSessionId must be at least {MIN_SESSION_ID} characters, got {session_id!r}",
                400,
            )
        if self._throttled(now):
            return session_id, _aws_error("ThrottlingException", "Rate exceeded", 429)
        return session_id, None

    def _record(self, op: str, session_id: str, now: float, response: Response) -> Response:
        self.calls.append(CallRecord(op, session_id, now, response.status_code))
        return response

    async def _invoke(self, request: Request) -> Response:
        now = time.monotonic()
        session_id, error = self._check(request, "invoke", now)
        if error is not None:
            return self._record("invoke", session_id, now, error)
        body = await request.body()
        try:
            s, base = await self._session(session_id)
        except _QuotaExceeded as exc:
            return self._record(
                "invoke", session_id, now, _aws_error("ServiceQuotaExceededException", str(exc), 402)
            )
        except Exception as exc:
            return self._record(
                "invoke", session_id, now,
                _aws_error("RuntimeClientError", f"the agent container did not start: {exc}", 424),
            )
        s.invocations += 1
        if s.invocations <= self.cold_start_failures:
            return self._record(
                "invoke", session_id, now,
                _aws_error(
                    "RuntimeClientError",
                    "Received error (500) from runtime. The container is not serving yet.",
                    424,
                ),
            )
        assert self._client is not None
        headers = {
            SESSION_HEADER: session_id,
            "content-type": request.headers.get("content-type", "application/json"),
        }
        if s.proc is not None:
            headers.update(s.proc.auth_headers)
        elif self.agent_token:
            headers[TOKEN_HEADER] = self.agent_token
        s.in_flight += 1
        try:
            r = await self._client.post(f"{base}/invocations", content=body, headers=headers)
        except httpx.HTTPError as exc:
            return self._record(
                "invoke", session_id, now,
                _aws_error("RuntimeClientError", f"could not reach the agent: {exc!r}", 424),
            )
        finally:
            s.in_flight -= 1
            s.last_used = time.monotonic()
        if r.status_code != 200:
            return self._record(
                "invoke", session_id, now,
                _aws_error(
                    "RuntimeClientError",
                    f"Received error ({r.status_code}) from runtime: {r.text[:2000]}",
                    424,
                ),
            )
        return self._record(
            "invoke", session_id, now,
            Response(
                r.content,
                media_type=r.headers.get("content-type", "application/json"),
                headers={SESSION_HEADER: session_id},
            ),
        )

    async def _stop(self, request: Request) -> Response:
        now = time.monotonic()
        session_id, error = self._check(request, "stop", now)
        if error is not None:
            return self._record("stop", session_id, now, error)
        s = self.sessions.pop(session_id, None)
        if s is None:
            return self._record(
                "stop", session_id, now,
                _aws_error("ResourceNotFoundException", f"Session {session_id!r} not found", 404),
            )
        await self._end(s)
        return self._record(
            "stop", session_id, now, JSONResponse({}, headers={SESSION_HEADER: session_id})
        )

    async def _ping(self, _request: Request) -> Response:
        return JSONResponse({"status": "Healthy", "sessions": len(self.sessions)})

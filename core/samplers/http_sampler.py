"""What the vLLM and SGLang samplers share: config, connection pool, retries, cancel, errors.

Defines:

- ``HttpSamplerConfig``: servers, endpoint, timeouts, retries, health checks, pool size.
- ``HttpSampler``: the base of ``VLLMSampler`` and ``SGLangSampler``. A subclass
  says how to build a request body and parse a response; this class sends it.
- ``affinity_key``: the routing key sent for a session (a hash, never the id).

Rules the base enforces:

- **Retries on connection errors only.** A refused or reset connection, or a
  kept-alive connection the server closed, is retried (on another server when
  there is one, with exponential backoff once all were tried). An HTTP answer,
  even a 500, is never retried: the server saw the request, and generating
  twice would silently change what the trace records. A hang ends at
  ``request_timeout_s`` with a ``SamplerError``, not a retry.
- **The session id never leaves the gateway.** It is the agent's credential,
  so routers get ``affinity_key(session_id)``, a stable hash of it.
- **Cancelling the awaiting task cancels the generation.** httpx closes the
  connection of a cancelled request (what vLLM watches for); subclasses add
  an explicit abort call where the engine has one (SGLang ``/abort_request``).
- **The prompt is encoded before the first await** and never kept: the gateway
  appends to that buffer after ``sample`` returns.
- **An answer from other weights is never returned.** A subclass that sees an
  answer from weights other than the pushed ones (SGLang's launch version
  ``"default"`` after a push) raises ``WrongWeights``: the server is taken out
  of rotation until the current weights are pushed to it, and the request is
  sent again on another server (the discarded answer was never recorded).
- **A generation the server aborted mid-way goes on** (``continue_aborted``,
  partial rollouts): an answer with finish reason ``abort`` (the engine aborting
  its running requests at a weight push, ``abort_on_push``: SGLang's
  ``abort_all_requests``, vLLM's ``POST /pause?mode=abort``) is sent again with
  its tokens appended to the prompt and ``max_tokens`` reduced, at most
  ``MAX_CONTINUATIONS`` times; the result joins the parts, with one ``Segment``
  per weight version and each token's logprob from the weights that sampled
  it; routed experts (R3), when the parts carry them, are kept per part
  (``joined_routed_experts``). An abort with no tokens is sent again only when the weights changed since
  it was sent (a push aborted it before its first token); otherwise it stays
  aborted.
- **Nothing is sent while a push that aborts is under way** (``hold``/``release``,
  called by the ``WeightPusher``; in a gateway shard, by the trainer over
  ``POST /admin/sampler/hold``): a continuation or a new request waits for the
  push to end, so it carries the new version (and vLLM's cache salt) and is
  labelled with the weights that will sample it. That includes a request that
  passed the gate before ``hold`` but had not begun writing (waiting for a
  pooled connection, say): httpx's ``trace`` hook stops it before its first
  byte and it goes back to the gate, to be built again under the new version.
  ``quiesce`` holds and returns once no request is mid-write, so nothing
  reaches a server after it returns until ``release``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import secrets
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import httpx

from core.errors import ConfigError, SamplerError
from core.http import ShardedClient
from core.samplers.http_pool import ServerPool, ServerState
from core.types import FinishReason, SampleResult, SamplingParams, Segment

__all__ = ["HttpSampler", "HttpSamplerConfig", "WrongWeights", "affinity_key"]

log = logging.getLogger(__name__)

SAMPLER_KINDS = ("vllm", "sglang")
VLLM_ENDPOINTS = ("generate", "completions")

CONTROL_CONNECTIONS = 16
"""Connections kept for the calls that are not generations (``HttpSampler.client``)."""

MAX_CONTINUATIONS = 16
"""Most times one generation is sent again after an abort (one per weight push it spans)."""

# Connection-level failures: the request was not (or not fully) answered, so it is
# safe to send again. Timeouts are not here: a hang must surface, not repeat.
_RETRYABLE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass
class HttpSamplerConfig:
    """Where the inference servers are and how to talk to them."""

    kind: str = "vllm"
    """``vllm`` or ``sglang``: which protocol the servers speak."""
    urls: list[str] = field(default_factory=list)
    """Server (or router) base URLs, e.g. ``["http://10.0.0.5:8000"]``; sessions stick to one."""
    vllm_endpoint: str = "generate"
    """vLLM only: ``generate`` (``POST /inference/v1/generate``, token ids in and out) or
    ``completions`` (``POST /v1/completions`` with a token-id prompt and ``return_token_ids``,
    for vLLM builds or routers without the first)."""
    model: str = ""
    """Model name sent to vLLM (``model`` field); empty lets the server use its only model."""
    api_key: str = ""
    """Sent as ``Authorization: Bearer`` when set (vLLM ``--api-key``, SGLang ``--api-key``)."""
    connect_timeout_s: float = 5.0
    """Limit for opening a connection."""
    request_timeout_s: float = 600.0
    """Limit for one generation (the server sends nothing until it is done)."""
    connect_retries: int = 3
    """Extra attempts after a connection error (never after an HTTP answer)."""
    retry_backoff_s: float = 0.25
    """First backoff once every server was tried; doubles per attempt."""
    health_path: str = "/health"
    """Path probed on each server by the background health checks."""
    health_interval_s: float = 5.0
    """Seconds between health-check rounds; 0 disables the checks."""
    health_timeout_s: float = 2.0
    """Limit for one health check."""
    unhealthy_after: int = 2
    """Consecutive failed checks that take a server out of rotation."""
    healthy_after: int = 1
    """Consecutive passed checks that put it back."""
    max_connections: int = 256
    """Connections across all shards of the HTTP pool (about the concurrent requests)."""
    connections_per_shard: int = 8
    """Connections per httpx pool shard (see ``core.http.ShardedClient`` for why shards)."""
    affinity_header: bool = True
    """Send the session's routing header (vLLM ``x-session-id``, SGLang ``X-SMG-Routing-Key``)."""
    return_routed_experts: bool = False
    """Ask SGLang for routed experts (R3; needs ``--enable-return-routed-experts``). vLLM
    returns them whenever the server was started to; either way they reach the ``SampleResult``
    (per part for a generation continued after aborts: ``joined_routed_experts``)."""
    extra_sampling_params: dict[str, Any] = field(default_factory=dict)
    """Merged into the request's sampling params (e.g. ``repetition_penalty``)."""
    abort_timeout_s: float = 2.0
    """Limit for the abort call sent when a request is cancelled (SGLang)."""
    continue_aborted: bool = True
    """A generation the server aborted after generating tokens (a weight push with
    ``abort_on_push``) is sent again with those tokens appended, so the turn goes on under
    the new weights, one segment per version (a partial rollout); false: it stays aborted."""
    abort_on_push: bool = False
    """A weight push aborts the requests running instead of letting them finish on the old
    weights (SGLang: ``abort_all_requests``; vLLM: ``POST /pause?mode=abort`` before the
    reload and ``POST /resume`` after it); with ``continue_aborted`` they go on under the
    new ones keeping their tokens."""
    weight_version: int = 0
    """Weight version reported when the server does not say (vLLM never does);
    the trainer sets ``sampler.weight_version`` after each sync."""

    key_prefix: ClassVar[str] = "HttpSamplerConfig"
    """How error messages name these fields (``sampler`` in the training config)."""
    urls_example: ClassVar[str] = (
        "HttpSamplerConfig(urls=['http://127.0.0.1:8000']) (python -m core.gateway: --server-url)"
    )
    """The fix an empty ``urls`` error suggests."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the bad field and the fix."""
        if self.kind not in SAMPLER_KINDS:
            raise ConfigError(
                f"{self.key_prefix}.kind={self.kind!r} is not supported; use one of {SAMPLER_KINDS}"
            )
        if not self.urls:
            raise ConfigError(
                f"{self.key_prefix}.urls is empty; give the {self.kind} server URLs, e.g. "
                f"{self.urls_example}"
            )
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"{self.key_prefix}.urls entry {url!r} must start with http:// or https://")
        if self.vllm_endpoint not in VLLM_ENDPOINTS:
            raise ConfigError(
                f"{self.key_prefix}.vllm_endpoint={self.vllm_endpoint!r} is not supported; use one of {VLLM_ENDPOINTS}"
            )
        for name in (
            "connect_timeout_s",
            "request_timeout_s",
            "health_timeout_s",
            "abort_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.key_prefix}.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("connect_retries", "health_interval_s", "retry_backoff_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{self.key_prefix}.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in (
            "unhealthy_after",
            "healthy_after",
            "max_connections",
            "connections_per_shard",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{self.key_prefix}.{name} must be >= 1, got {getattr(self, name)!r}")


class WrongWeights(SamplerError):
    """A server answered from weights other than the pushed ones (it was marked ``needs_weights``)."""


class _HeldBack(Exception):
    """A request about to write its first byte found the sampler held: nothing was sent, so it
    goes back to the gate and is built again (new version, new cache salt) after ``release``."""


@dataclass(frozen=True)
class _Call:
    """One request as ``_post`` sends it (and sends again after a connection error)."""

    path: str
    content: bytes
    headers: dict[str, str]
    key: str
    """Routing key (``affinity_key``)."""
    rid: str
    only: ServerState | None
    """Send to this server only (no routing, no other server on retry)."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def affinity_key(session_id: str) -> str:
    """Stable routing key for a session: a hash, so the id (a credential) stays private."""
    return hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()


def finish_reason_of(value: object) -> FinishReason | None:
    """Map an engine's finish reason string to ours (None when unknown)."""
    try:
        return FinishReason(str(value))
    except ValueError:
        return None


def joined_routed_experts(parts: Sequence[SampleResult]) -> dict[str, Any] | None:
    """The routed experts (R3) of a generation sent in parts, kept per part in order.

    Each part is its own request (prompt + the tokens before it), so the engine's
    routing for it is its own blob, in the engine's format and from the weights that
    sampled the part; a replay needs each generated token's routing from its own part.
    ``{"format": "parts", "parts": [{"start", "end", "weight_version", "routed_experts"}]}``
    with ``[start, end)`` the part's tokens in the joined reply; None when no part has any.
    """
    out: list[dict[str, Any]] = []
    start = 0
    for part in parts:
        end = start + len(part.token_ids)
        if part.token_ids:
            out.append({
                "start": start,
                "end": end,
                "weight_version": part.weight_version,
                "routed_experts": part.routed_experts,
            })
        start = end
    if all(p["routed_experts"] is None for p in out):
        return None
    return {"format": "parts", "parts": out}


class HttpSampler:
    """``core.interfaces.Sampler`` over HTTP; subclasses supply the protocol.

    Subclasses set ``protocol`` and ``affinity_header_name`` and implement
    ``_request`` and ``_parse``; they may override ``_on_cancel``.
    """

    protocol: ClassVar[str] = "HTTP"
    """Engine name used in error messages."""
    affinity_header_name: ClassVar[str] = ""
    """Header carrying ``affinity_key(session_id)``."""

    def __init__(self, config: HttpSamplerConfig) -> None:
        """Validate ``config``; connections open lazily in the caller's event loop.

        Raises:
            ConfigError: a bad field (named in the message).
        """
        config.validate()
        self.config = config
        self.pool = ServerPool(
            config.urls,
            health_path=config.health_path,
            health_interval_s=config.health_interval_s,
            health_timeout_s=config.health_timeout_s,
            unhealthy_after=config.unhealthy_after,
            healthy_after=config.healthy_after,
        )
        self.weight_version = config.weight_version
        self.pushed = False
        """True once a ``WeightPusher`` loaded weights into the servers: from then on an
        answer from launch weights is a mismatch, not the current version."""
        self._held: asyncio.Future[None] | None = None
        """Set while a push that aborts running requests is under way (``hold``)."""
        self._writing = 0
        """Requests writing to a server now (first header byte to last body byte)."""
        self._written: asyncio.Event | None = None
        """Set when ``_writing`` drops to 0 (what ``quiesce`` waits for)."""
        self._client: ShardedClient | None = None
        self._control: ShardedClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        base = {"content-type": "application/json"}
        if config.api_key:
            base["authorization"] = f"Bearer {config.api_key}"
        self._base_headers = base

    # -- what subclasses provide --------------------------------------------------------

    def _request(
        self, prompt: Sequence[int], params: SamplingParams, rid: str
    ) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) for one generation."""
        raise NotImplementedError

    def _parse(self, server: ServerState, data: Any, params: SamplingParams, version: int) -> SampleResult:
        """A ``SampleResult`` from the decoded JSON answer (``SamplerError`` if malformed,
        ``WrongWeights`` from weights other than the pushed ones).

        ``version``: the sampler's ``weight_version`` when the request was sent, the
        answer's version when the engine reports none (a push while the request was in
        flight must not label tokens of the old weights with the new version).
        """
        raise NotImplementedError

    def _on_cancel(self, client: ShardedClient, server: ServerState, rid: str) -> None:
        """Called when the awaiting task is cancelled (the connection is closed anyway)."""

    # -- plumbing -----------------------------------------------------------------------

    def _http(self) -> ShardedClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # Clients bind to the loop that first uses them (each asyncio.run has its own).
            cfg = self.config
            self._client = self._new_client(cfg.max_connections, cfg.connections_per_shard)
            self._control = self._new_client(CONTROL_CONNECTIONS, CONTROL_CONNECTIONS)
            self._loop = loop
        return self._client

    def _new_client(self, max_connections: int, per_shard: int) -> ShardedClient:
        cfg = self.config
        return ShardedClient(
            max_connections=max_connections,
            per_shard=per_shard,
            # One TLS context for all shards: building one per client costs ~35 ms each.
            verify=_tls_context(),
            timeout=httpx.Timeout(
                connect=cfg.connect_timeout_s,
                read=cfg.request_timeout_s,
                write=cfg.request_timeout_s,
                pool=cfg.request_timeout_s,
            ),
        )

    def client(self) -> ShardedClient:
        """The HTTP client of the running loop for calls that are not generations (weight
        push, pause, sleep, health checks, aborts): the servers, TLS context and timeouts
        of the generations, but connections of its own, so a pool full of running
        generations never queues the push that would abort them, or a health check."""
        self._http()
        assert self._control is not None
        return self._control

    @property
    def base_headers(self) -> dict[str, str]:
        """Headers every request to the servers carries (content type, API key); a copy."""
        return dict(self._base_headers)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def hold(self) -> None:
        """Keep new requests (and continuations of aborted ones) from being sent until
        ``release``: a push is about to abort the running ones."""
        if self._held is None:
            self._held = asyncio.get_running_loop().create_future()

    def release(self) -> None:
        """Let requests held by ``hold`` go (after ``weight_version`` moved, or the push failed)."""
        held, self._held = self._held, None
        if held is not None and not held.done():
            held.set_result(None)

    def _holding(self) -> asyncio.Future[None] | None:
        """The hold in force in this event loop (a hold left in a closed loop holds nothing)."""
        held = self._held
        return held if held is not None and held.get_loop() is asyncio.get_running_loop() else None

    @property
    def held(self) -> bool:
        """Between ``hold`` and ``release``."""
        return self._held is not None

    async def quiesce(self) -> None:
        """``hold``, then wait until no request is writing to a server: from then until
        ``release`` no byte of a generate request reaches one (a request not yet writing is
        stopped before its first byte and sent again after ``release``)."""
        self.hold()
        while self._writing:
            if self._written is None:
                self._written = asyncio.Event()
            await self._written.wait()

    def _write_tracer(self) -> Any:
        """httpx's ``trace`` extension for one request: refuses to start writing while held
        (``_HeldBack``) and counts the request in ``_writing`` until its body is written."""
        state = {"writing": False}

        def done() -> None:
            if state["writing"]:
                state["writing"] = False
                self._writing -= 1
                if not self._writing and self._written is not None:
                    self._written.set()
                    self._written = None

        async def trace(name: str, info: dict[str, Any]) -> None:
            if name.endswith("send_request_headers.started"):
                if self._holding() is not None:
                    raise _HeldBack
                state["writing"] = True
                self._writing += 1
            elif name.endswith(("send_request_body.complete", ".failed")):
                done()

        trace.done = done  # type: ignore[attr-defined]
        return trace

    def fail(self, server: ServerState | None, what: str, fix: str) -> SamplerError:
        """A ``SamplerError`` naming the engine, the server, what went wrong and the fix."""
        where = f" {server.url}" if server is not None else ""
        return SamplerError(self.named(f"{self.protocol} server{where}: {what}; {fix}"))

    def named(self, message: str) -> str:
        """``message`` with config fields named as the user set them (``sampler.urls`` in a run)."""
        prefix = self.config.key_prefix
        return message if prefix == "HttpSamplerConfig" else message.replace("HttpSamplerConfig.", prefix + ".")

    async def sample(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> SampleResult:
        """Generate on the session's server; see ``core.interfaces.Sampler``.

        Raises:
            SamplerError: no server reachable after the retries, an HTTP error
                answer, a hang past ``request_timeout_s``, or a malformed answer.
        """
        if len(prompt_token_ids) == 0:
            raise SamplerError(
                f"session {session_id[:10]!r}: the prompt is empty; send at least one token"
            )
        return await self._sample(prompt_token_ids, params, affinity_key(session_id), None)

    async def sample_on(
        self, server: ServerState, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> SampleResult:
        """Generate on ``server`` itself, whatever the routing (the fleet's logprob probe).

        Raises:
            SamplerError: as ``sample``.
        """
        return await self._sample(prompt_token_ids, params, affinity_key(server.url), server)

    async def _sample(
        self, prompt: Sequence[int], params: SamplingParams, key: str, only: ServerState | None
    ) -> SampleResult:
        result = await self._sample_once(prompt, params, key, only)
        parts: list[SampleResult] = []
        while (
            self.config.continue_aborted
            and only is None
            and result.finish_reason is FinishReason.ABORT
            and (result.token_ids or self._held is not None or self.weight_version != result.weight_version)
            and len(parts) < MAX_CONTINUATIONS
        ):
            # Aborted mid-way (a weight push): go on from what it generated, on the new weights.
            parts.append(result)
            prompt = [*prompt, *result.token_ids]
            params = replace(params, max_tokens=params.max_tokens - len(result.token_ids))
            if params.max_tokens < 1:
                break
            result = await self._sample_once(prompt, params, key, only)
        return self._joined([*parts, result]) if parts else result

    def _joined(self, parts: list[SampleResult]) -> SampleResult:
        """One result from the parts of a generation sent again after aborts."""
        ids: list[int] = []
        logprobs: list[float] = []
        segments: list[Segment] = []
        if not any(part.token_ids for part in parts):
            return parts[-1]
        for part in parts:
            if not part.token_ids:
                continue
            if segments and part.weight_version < segments[-1].weight_version:
                raise SamplerError(self.named(
                    f"a generation continued after an abort came back from weight version "
                    f"{part.weight_version}, older than its earlier part's {segments[-1].weight_version}; "
                    "the servers serve mixed weights (check the weight push)"
                ))
            start = len(ids)
            ids.extend(part.token_ids)
            logprobs.extend(part.logprobs)
            if segments and segments[-1].weight_version == part.weight_version:
                segments[-1] = Segment(segments[-1].start, len(ids), part.weight_version)
            else:
                segments.append(Segment(start, len(ids), part.weight_version))
        return SampleResult(
            ids,
            logprobs,
            parts[-1].finish_reason,
            segments[0].weight_version,
            routed_experts=joined_routed_experts(parts),
            segments=tuple(segments) if len(segments) > 1 else (),
        )

    async def _sample_once(
        self, prompt: Sequence[int], params: SamplingParams, key: str, only: ServerState | None
    ) -> SampleResult:
        if self._closed:
            raise SamplerError(f"the {self.protocol} sampler is closed; build a new one")
        while True:
            while (held := self._holding()) is not None:
                await asyncio.shield(held)  # a push is aborting the running requests: wait for it
            version = self.weight_version
            rid = "tracerl-" + secrets.token_hex(12)
            path, body = self._request(prompt, params, rid)
            headers = dict(self._base_headers)
            if self.config.affinity_header and self.affinity_header_name:
                headers[self.affinity_header_name] = key
            # Encoded now: the gateway may append to the prompt once we return.
            content = json.dumps(body, separators=(",", ":")).encode()
            call = _Call(path, content, headers, key, rid, only)
            del body
            try:
                return await self._send(call, params, version)
            except _HeldBack:  # held before its first byte: built again under the new version
                continue

    async def _send(self, call: _Call, params: SamplingParams, version: int) -> SampleResult:
        """``call`` answered and parsed; sent again elsewhere when a server answers from other weights."""
        only, path = call.only, call.path
        wrong: WrongWeights | None = None
        for _ in range(1 if only is not None else max(1, len(self.pool.servers))):
            resp, server = await self._post(call)
            if not 200 <= resp.status_code < 300:
                raise self._http_error(server, path, resp)
            try:
                data = json.loads(resp.content)
            except ValueError as exc:
                raise self.fail(
                    server,
                    f"answered POST {path} with malformed JSON ({exc}): {resp.text[:200]!r}",
                    "check that HttpSamplerConfig.urls points at the engine (or its router) and not at a proxy page",
                ) from exc
            try:
                return self._parse(server, data, params, version)
            except WrongWeights as exc:  # the server is out of rotation now: send it elsewhere
                wrong = exc
        assert wrong is not None
        raise wrong

    async def _post(self, call: _Call) -> tuple[httpx.Response, ServerState]:
        path, content, headers, key, rid = call.path, call.content, call.headers, call.key, call.rid
        client = self._http()
        self.pool.ensure_health_checks(self.client())
        cfg = self.config
        attempts = 1 + cfg.connect_retries
        tried: set[str] = set()
        errors: list[str] = []
        for _ in range(attempts):
            server = call.only if call.only is not None else self.pool.pick(key, avoid=tried)
            if server.url in tried and cfg.retry_backoff_s:
                # Every server was tried: back off before knocking again.
                await asyncio.sleep(
                    cfg.retry_backoff_s * 2 ** (len(errors) - len(self.pool.servers))
                )
            tried.add(server.url)
            server.requests += 1
            tracer = self._write_tracer()
            try:
                resp = await client.post(
                    server.url + path, content=content, headers=headers, extensions={"trace": tracer}
                )
            except _HeldBack:
                server.requests -= 1  # nothing was sent
                raise
            except asyncio.CancelledError:
                self._on_cancel(self.client(), server, rid)
                raise
            except _RETRYABLE as exc:
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
                errors.append(f"{server.url}: {reason}")
                if isinstance(exc, httpx.ConnectError):  # refused: certainly down
                    self.pool.mark_down(server, reason)
                continue
            except httpx.ConnectTimeout as exc:
                errors.append(f"{server.url}: connect timed out after {cfg.connect_timeout_s}s")
                self.pool.mark_down(server, f"ConnectTimeout: {exc}")
                continue
            except httpx.TimeoutException as exc:
                raise self.fail(
                    server,
                    f"no answer to POST {path} within HttpSamplerConfig.request_timeout_s={cfg.request_timeout_s} "
                    f"({type(exc).__name__})",
                    "the server hangs or is overloaded; check its log, or raise HttpSamplerConfig.request_timeout_s "
                    "for very long generations",
                ) from exc
            except httpx.HTTPError as exc:
                raise self.fail(
                    server,
                    f"POST {path} failed: {type(exc).__name__}: {exc}",
                    "check the server URL and its log",
                ) from exc
            finally:
                tracer.done()
            return resp, server
        raise SamplerError(self.named(
            f"could not reach any {self.protocol} server after {attempts} attempts "
            f"({'; '.join(errors[-len(self.pool.servers) - 1 :])}); check the servers are running and "
            f"HttpSamplerConfig.urls={[s.url for s in self.pool.servers]!r} is right"
        ))

    def wrong_weights(self, server: ServerState, what: str) -> WrongWeights:
        """Take ``server`` out of rotation until it is re-pushed; the error to raise."""
        reason = f"{what} although weight version {self.weight_version} was pushed"
        self.pool.mark_needs_weights(server, reason)
        return WrongWeights(self.named(
            f"{self.protocol} server {server.url}: {reason}: it serves other weights (restarted with its "
            "launch weights?) and gets no traffic until the current weights are pushed to it"
        ))

    def _http_error(self, server: ServerState, path: str, resp: httpx.Response) -> SamplerError:
        code = resp.status_code
        detail = resp.text[:300]
        if code == 404:
            fix = self._not_found_fix()
        elif code in (401, 403):
            fix = "set HttpSamplerConfig.api_key to the server's --api-key"
        elif code in (400, 422):
            fix = "the server rejected the request; a prompt longer than its context length is the usual cause"
        elif code == 429 or code == 503:
            fix = "the server is overloaded or starting; add servers or lower concurrency"
        else:
            fix = "the engine failed on this request (not retried: it may have generated); check its log"
        return self.fail(server, f"answered POST {path} with HTTP {code}: {detail!r}", fix)

    def _not_found_fix(self) -> str:
        return "check that HttpSamplerConfig.urls points at the engine's root URL (no /v1 suffix)"

    async def check_health(self) -> list[dict[str, object]]:
        """Run one round of health checks now; returns the pool's snapshot."""
        await self.pool.check_all(self.client())
        return self.pool.snapshot()

    async def aclose(self) -> None:
        """Stop health checks, let abort calls finish (bounded), close connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.pool.stop()
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.config.abort_timeout_s)
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
            if self._control is not None:
                await self._control.aclose()
        self._client = self._control = None


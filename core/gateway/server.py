"""Serving the gateway with uvicorn inside the caller's asyncio loop.

Defines ``GatewayServer``: ``await start()`` binds (port 0 picks a free one) and
returns once the socket listens; ``base_url`` is the OpenAI-style URL ending in
``/v1``; ``await stop()`` shuts down. Signal handling is left to the host
process (uvicorn's own handlers would hijack Ctrl-C of the trainer).

Connection limits come from the gateway's config: ``max_connections`` (beyond
it new requests get 503 and a warning naming the key is logged; connections
still sending headers do not count), ``max_pending_headers_per_client`` (an
address's oldest half-sent connections beyond it are closed),
``keep_alive_timeout_s``, and
``header_read_timeout_s``: uvicorn has no timeout for a request's headers, so
its HTTP protocol is subclassed to note when a request's headers started and a
once-a-second sweep closes connections whose headers are overdue (a client
that connects and sends nothing, or half a request line, no longer holds a
connection forever). The body-read timeout is the gateway's own
(``core.gateway.fastpath.read_body``).

Also defines ``tune_gc()``, which ``start()`` applies by default (the trainer
serves the gateway in its own process) and ``python -m core.gateway`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.errors import RuntimeStartError
from core.gateway.app import build_app

if TYPE_CHECKING:
    import uvicorn

    from core.gateway.service import Gateway

__all__ = ["GatewayServer", "tune_gc"]

GC_THRESHOLD = (20_000, 20, 50)
"""Cyclic-GC thresholds while a gateway serves (CPython's defaults are (700, 10, 10))."""

_gc_tuned = False

log = logging.getLogger("core.gateway")

_CAP_MESSAGE = "Exceeded concurrency limit."
"""What uvicorn logs when ``limit_concurrency`` turns a request away."""


class _NameTheCap(logging.Filter):
    """Rewrites uvicorn's 503 warning so the log says which setting bit and what to do."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _CAP_MESSAGE:
            record.msg = (
                "gateway: connection cap reached (gateway.max_connections): a new request got 503; "
                "raise the cap if the agents legitimately hold this many connections"
            )
            record.args = ()
        return True


_cap_filter = _NameTheCap()


def tune_gc() -> bool:
    """Freeze the heap built so far and raise the young-generation GC threshold, once per process.

    Why: a gateway turn allocates a few hundred container objects (parsed
    JSON, message dicts, token lists); with the default threshold of 700 the
    young generation is collected every two or three turns, and each full
    collection rescans everything the process holds (a trainer's config, model
    wrappers, every session's token lists). ``gc.freeze()`` moves the start-up
    heap out of the collector's view, and a threshold of 20,000 makes young
    collections about thirty times rarer. Reference counting still frees
    acyclic garbage at once; only cycles wait longer. Process-wide and
    idempotent: later calls do nothing and return False.

    It also hands the memory that start-up freed back to the OS
    (``_trim_heap``): loading a real tokenizer parses a ~10 MB ``tokenizer.json``
    and glibc keeps the ~50 MB it freed mapped; with Qwen3's tokenizer a gateway
    held 181 MB before and 127 MB after.
    """
    import gc

    global _gc_tuned
    if _gc_tuned:
        return False
    _gc_tuned = True
    gc.collect()
    _trim_heap()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    return True


def _trim_heap() -> None:
    """``malloc_trim(0)``: return glibc's free heap pages to the OS (nothing elsewhere)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return
    trim(0)


def _protocol_class(max_connections: int, max_pending_per_client: int, grace_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, noting since when a request's headers are awaited.

    Connections still sending headers are tracked per client address: they do not count
    toward ``max_connections`` (checked here instead of by uvicorn's ``limit_concurrency``,
    which counts every open socket, so half-sent headers turned agents' requests into
    503s), and beyond ``max_pending_per_client`` an address's oldest ones (pending for more
    than ``grace_s``) are closed.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    pending: dict[str, dict[_Protocol, float]] = {}
    """Per client address: its connections whose headers are incomplete, with since when."""

    class _Protocol(HttpToolsProtocol):
        headers_since: float | None = None
        """Loop time the connection opened or the current request's first byte came; None
        while no request is half-received (headers complete, or idle between requests)."""
        peer: str = ""

        def _set_pending(self, since: float | None) -> None:
            self.headers_since = since
            mine = pending.get(self.peer)
            if since is None:
                if mine is not None:
                    mine.pop(self, None)
                    if not mine:
                        del pending[self.peer]
                return
            mine = pending.setdefault(self.peer, {})
            mine[self] = since
            if max_pending_per_client and len(mine) > max_pending_per_client:
                cutoff = since - grace_s
                old = sorted((t, id(c), c) for c, t in mine.items() if t < cutoff and c is not self)
                for _, _, conn in old[: len(mine) - max_pending_per_client]:
                    conn._close_for_pending()

        def _close_for_pending(self) -> None:
            self._set_pending(None)
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()
            log.warning(
                "gateway: closed a connection of %s: more than %d connections of that address "
                "were still sending request headers (gateway.max_pending_headers_per_client)",
                self.peer, max_pending_per_client,
            )

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            client = self.client
            self.peer = str(client[0]) if client else ""
            self._set_pending(self.loop.time())

        def connection_lost(self, exc: Exception | None) -> None:
            self._set_pending(None)
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.headers_since is None:
                self._set_pending(self.loop.time())

        def on_headers_complete(self) -> None:
            self._set_pending(None)
            if max_connections:
                waiting = sum(len(m) for m in pending.values())
                full = len(self.connections) - waiting >= max_connections or len(self.tasks) >= max_connections
                # uvicorn answers 503 (and logs why) when len(connections) >= limit_concurrency
                self.limit_concurrency = 0 if full else None
            super().on_headers_complete()

    return _Protocol


def _server_class() -> type[uvicorn.Server]:
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return _Server


class GatewayServer:
    """uvicorn serving a ``Gateway`` on ``host:port`` in the running loop."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        public_host: str = "",
        gc_tuning: bool = True,
    ) -> None:
        """Prepare (nothing binds until ``start``).

        Args:
            gateway: The gateway to serve.
            host: Address to bind.
            port: Port; 0 picks a free one.
            public_host: Host agents dial, when it differs from ``host``.
            gc_tuning: Apply ``tune_gc()`` (process-wide) once serving starts; turn
                off when the host process manages the garbage collector itself.
        """
        self.gateway = gateway
        self.host = host
        self.port = port
        self.public_host = public_host or host
        self.gc_tuning = gc_tuning
        self.app = build_app(gateway)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None

    @property
    def admin_token(self) -> str:
        """Token the admin routes require."""
        return self.gateway.admin_token

    @property
    def root_url(self) -> str:
        """``http://host:port`` (the anthropic SDK's base URL)."""
        return f"http://{self.public_host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (the openai SDK's base URL)."""
        return self.root_url + "/v1"

    async def start(self, timeout_s: float = 30.0) -> None:
        """Bind and serve in the background; returns once listening.

        Raises:
            RuntimeStartError: the port could not be bound or startup timed out.
        """
        import uvicorn

        cfg = self.gateway.config
        config = uvicorn.Config(
            self.app, host=self.host, port=self.port, log_level="warning", access_log=False,
            lifespan="off", timeout_keep_alive=cfg.keep_alive_timeout_s,
            # max_connections is checked by the protocol, leaving out connections still
            # sending headers (uvicorn's limit_concurrency would count them).
            limit_concurrency=None,
            # Agents reach the gateway directly; X-Forwarded-* rewriting is per-request work for nothing.
            proxy_headers=False,
            http=_protocol_class(
                cfg.max_connections, cfg.max_pending_headers_per_client, cfg.pending_headers_grace_s
            ),
        )
        logging.getLogger("uvicorn.error").addFilter(_cap_filter)  # idempotent: a set of filters
        self._server = _server_class()(config)
        self._task = asyncio.create_task(self._server.serve())
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._server.started:
            if self._task.done() or asyncio.get_running_loop().time() > deadline:
                exc = self._task.exception() if self._task.done() else None
                await self.stop()
                raise RuntimeStartError(
                    f"gateway could not start on {self.host}:{self.port}: {exc or 'startup timed out'}"
                )
            await asyncio.sleep(0.01)
        sockets = [s for srv in self._server.servers for s in srv.sockets]
        self.port = sockets[0].getsockname()[1]
        if cfg.header_read_timeout_s:
            self._reaper = asyncio.create_task(self._close_slow_headers(cfg.header_read_timeout_s))
        if self.gc_tuning:
            tune_gc()

    async def _close_slow_headers(self, timeout: float) -> None:
        """Close connections whose request headers have not completed within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        while self._server is not None:
            await asyncio.sleep(min(1.0, timeout / 4))
            if self._server is None:
                return
            now = loop.time()
            for conn in list(self._server.server_state.connections):
                since = getattr(conn, "headers_since", None)
                transport = getattr(conn, "transport", None)
                if since is None or now - since <= timeout or transport is None or transport.is_closing():
                    continue
                client = getattr(conn, "client", None)
                who = f"{client[0]}:{client[1]}" if client else "a client"
                log.warning(
                    "gateway: closed the connection of %s: no complete request headers within %s s "
                    "(gateway.header_read_timeout_s)", who, timeout,
                )
                transport.close()

    async def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(BaseException):
                await self._reaper
            self._reaper = None
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task
        self._server = None
        self._task = None
        self.gateway.close_render_threads()

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

"""The lean ASGI path for the per-turn routes, and a task-free disconnect watch.

Defines:

- ``HotRoutes``: an ASGI app that answers ``POST`` on the agent turn routes
  (``/v1/chat/completions``, ``/v1/messages``, ``/v1/v1/messages``, each also
  under ``/sessions/{sid}``) by calling their endpoint directly, and hands
  every other request to the Starlette app behind it. Profiling the gateway at
  256 concurrent sessions showed Starlette's middleware stack (server-error
  and exception middleware, router, ``request_response``, two ``send``
  wrappers) costing about a sixth of a turn's CPU; the endpoints already turn
  every exception into a response, so those layers add nothing on these routes.
- ``DisconnectWatch``: calls back when the client disconnects, without a
  per-turn ``asyncio.Task`` (see its docstring).
- ``read_body``: the request body straight from ``receive``, size- and time-limited;
  ``read_raw``: the same for a ``Request``, as the 413/408 ``GatewayError`` and a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.gateway.errors import request_timeout, too_large

__all__ = ["BodyTimeout", "ClientGone", "DisconnectWatch", "HotRoutes", "TooLarge", "read_body", "read_raw"]

log = logging.getLogger("core.gateway")

Endpoint = Callable[[Request], Awaitable[Response]]

_SESSIONS = "/sessions/"


class ClientGone(Exception):
    """The client disconnected before its turn was answered."""


class TooLarge(Exception):
    """The body passed the size limit while it was being read."""


class BodyTimeout(Exception):
    """The client stopped sending its body: it did not complete within the read timeout."""


def _ready(receive: Receive) -> tuple[Message | None, Awaitable[Message] | None]:
    """(message, None) when ``receive()`` has it without waiting, else (None, what to await).

    uvicorn parses a small body together with the headers, so the first
    ``receive()`` usually completes at once; only a call that would wait needs
    a timer. A coroutine that would wait is closed at its first suspension,
    before it takes a message (uvicorn's receive takes it only after its wait),
    and called again under the timer; a plain future is awaited as it is.
    """
    awaitable = receive()
    if not asyncio.iscoroutine(awaitable):
        if isinstance(awaitable, asyncio.Future) and awaitable.done():
            return awaitable.result(), None
        return None, awaitable
    try:
        awaitable.send(None)
    except StopIteration as stop:
        return stop.value, None
    awaitable.close()
    return None, receive()


async def read_body(receive: Receive, limit: int, timeout: float | None = None) -> bytes:
    """The whole request body, read from ``receive`` (no async generator, no copies per chunk).

    Args:
        receive: The ASGI receive channel.
        limit: Most bytes accepted.
        timeout: Seconds the rest of the body may take once a read has to wait
            (None: no limit). Bodies already received cost no timer.

    Raises:
        TooLarge: more than ``limit`` bytes arrived.
        ClientGone: the client disconnected before the body was complete.
        BodyTimeout: the body did not complete within ``timeout``.
    """
    chunks: list[bytes] = []
    size = 0
    deadline: float | None = None
    while True:
        if timeout is None:
            message = await receive()
        else:
            ready, pending = _ready(receive)
            if pending is None:
                message = ready  # type: ignore[assignment]
            else:
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + timeout
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await pending
                except TimeoutError:
                    raise BodyTimeout() from None
        if message["type"] != "http.request":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise TooLarge()
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_raw(
    request: Request, limit: int, timeout: float | None, *, limit_key: str = "gateway.max_body_bytes"
) -> bytes:
    """The request body: 413 over ``limit`` bytes (naming ``limit_key``), 408 (logged) when it
    stalls past ``timeout`` seconds."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise too_large(limit, limit_key)
    try:
        return await read_body(request.receive, limit, timeout)
    except TooLarge:
        raise too_large(limit, limit_key) from None
    except BodyTimeout:
        client = request.scope.get("client")
        who = f"{client[0]}:{client[1]}" if client else "a client"
        log.warning(
            "gateway: %s sent the headers of %s %s but not the whole body within %s s "
            "(gateway.body_read_timeout_s); answered 408 and closed the connection",
            who, request.method, request.url.path, timeout,
        )
        raise request_timeout(
            f"the request body did not arrive within {timeout} s (gateway.body_read_timeout_s); "
            "send the whole body promptly"
        ) from None


async def _awaited(awaitable: Awaitable[Message]) -> Message:
    return await awaitable


def _as_coroutine(awaitable: Awaitable[Message]) -> Coroutine[Any, Any, Message]:
    """``receive()``'s result as a coroutine (a server may return a plain future instead)."""
    if asyncio.iscoroutine(awaitable):
        return awaitable
    return _awaited(awaitable)


class DisconnectWatch:
    """Calls ``on_gone`` once ``receive`` reports ``http.disconnect``; ``close()`` stops watching.

    Why not a watcher task: a task per turn costs a ``create_task``, a loop
    iteration to start it and another to deliver its cancellation (about 8 us
    of a ~500 us turn, measured). This drives the ``receive()`` coroutine by
    hand instead, the way a Task would: each step runs it until it awaits an
    asyncio future and resumes it from that future's done-callback. The first
    step runs inline; ``close()`` closes the coroutine (its ``finally`` blocks
    run, e.g. uvicorn's event waiter is removed). ``on_gone`` runs from a
    future callback, outside any task, so it must only schedule work (cancel a
    task, set a flag).
    """

    __slots__ = ("_receive", "_on_gone", "_coro", "_waiting", "_closed", "_loop")

    def __init__(self, receive: Receive, on_gone: Callable[[], None]) -> None:
        self._receive = receive
        self._on_gone = on_gone
        self._loop = asyncio.get_running_loop()
        self._waiting: asyncio.Future[Any] | None = None
        self._closed = False
        self._coro = _as_coroutine(receive())
        self._step()

    def _step(self, _done: object = None) -> None:
        self._waiting = None
        if self._closed:
            return
        try:
            yielded = self._coro.send(None)
        except StopIteration as stop:
            message = stop.value
            if isinstance(message, dict) and message.get("type") == "http.disconnect":
                self._closed = True
                self._on_gone()
                return
            # Any other message (a stray body chunk): keep listening.
            self._coro = _as_coroutine(self._receive())
            self._loop.call_soon(self._step)
            return
        except BaseException:  # the server's receive failed: stop watching, as a dead task would
            self._closed = True
            return
        if getattr(yielded, "_asyncio_future_blocking", None):
            # The Task protocol: clear the flag, resume when the future is done.
            yielded._asyncio_future_blocking = False
            self._waiting = yielded
            yielded.add_done_callback(self._step)
        else:  # a bare ``yield`` (``asyncio.sleep(0)``): run again next iteration
            self._loop.call_soon(self._step)

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._waiting is not None:
            self._waiting.remove_done_callback(self._step)
            self._waiting = None
        self._coro.close()


class HotRoutes:
    """ASGI front: the turn routes go straight to their endpoints, the rest to ``app``."""

    def __init__(self, app: ASGIApp, hot: dict[str, Endpoint]) -> None:
        """Args:
        app: The full Starlette app (admin routes, GET routes, 404/405 handling).
        hot: Exact path (without the ``/sessions/{sid}`` prefix) to endpoint, for ``POST``.
        """
        self.app = app
        self.hot = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path: str = scope["path"]
            sid = ""
            if path.startswith(_SESSIONS):
                # Starlette's ``{sid}`` matches one non-empty segment; so does this.
                sid, sep, rest = path[len(_SESSIONS) :].partition("/")
                path = "/" + rest if sid and sep else ""
            endpoint = self.hot.get(path)
            if endpoint is not None:
                scope["path_params"] = {"sid": sid} if sid else {}
                response = await endpoint(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

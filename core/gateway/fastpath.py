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
- ``read_body``: the request body straight from ``receive``, size-limited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ClientGone", "DisconnectWatch", "HotRoutes", "TooLarge", "read_body"]

Endpoint = Callable[[Request], Awaitable[Response]]

_SESSIONS = "/sessions/"


class ClientGone(Exception):
    """The client disconnected before its turn was answered."""


class TooLarge(Exception):
    """The body passed the size limit while it was being read."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, read from ``receive`` (no async generator, no copies per chunk).

    Raises:
        TooLarge: more than ``limit`` bytes arrived.
        ClientGone: the client disconnected before the body was complete.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
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

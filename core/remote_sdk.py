"""What the remote backends (Tinker, SageMaker) share apart from the loss vocabulary.

Both SDKs hand back futures and serve sampling through a client that a weight
sync replaces; each plugin keeps its SDK's differences explicit:

- ``await_result`` / ``call_blocking``: resolve an SDK future from async code
  with a deadline, wrapping SDK exceptions in tracerl's own.
- ``SamplerSlot``: the current sampling client and its weight version, swapped
  atomically so requests already in flight finish on the client they started on.
- ``finish_reason``: an SDK stop reason as ours.
- ``missing_keys_error``: one ``ConfigError`` naming every missing required key.

Nothing here imports an SDK, torch or boto3. The loss settings they share are in
``core.algo.losses``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from core.errors import ConfigError, TracerlError, TrainingError
from core.types import FinishReason

T = TypeVar("T")
ClientT = TypeVar("ClientT")


def finish_reason(stop_reason: Any) -> FinishReason:
    """Map an SDK stop reason (``"stop"``/``"length"``, str or str-enum) to ours."""
    value = getattr(stop_reason, "value", stop_reason)
    if value == "length":
        return FinishReason.LENGTH
    if value == "stop":
        return FinishReason.STOP
    raise ValueError(f"unknown stop reason {stop_reason!r} (expected 'stop' or 'length')")


def _wrap(exc: BaseException, what: str, error_cls: type[TracerlError]) -> TracerlError:
    if isinstance(exc, TracerlError):
        return exc
    if isinstance(exc, TimeoutError):
        return error_cls(f"{what} timed out: {exc or 'no result before the deadline'}")
    return error_cls(f"{what} failed: {type(exc).__name__}: {exc}")


async def await_result(
    future: Any,
    *,
    what: str,
    timeout: float | None,
    error_cls: type[TracerlError] = TrainingError,
) -> Any:
    """Resolve an SDK future from async code, without blocking the event loop.

    Accepts what either SDK returns: an object with ``result_async(timeout)``
    (both SDKs' ``APIFuture``), any awaitable, a ``concurrent.futures.Future``
    or an object with a blocking ``result(timeout)``. SDK exceptions come back
    as ``error_cls`` (``TrainingError`` by default) naming ``what``.
    """
    try:
        if hasattr(future, "result_async"):
            return await future.result_async(timeout)
        if isinstance(future, concurrent.futures.Future):
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        if inspect.isawaitable(future):
            return await asyncio.wait_for(_as_coroutine(future), timeout)
        if hasattr(future, "result"):
            return await asyncio.to_thread(future.result, timeout)
        return future  # already a value
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise
        raise _wrap(exc, what, error_cls) from exc


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


def call_blocking(fn: Callable[[], T], *, what: str) -> T:
    """Run a blocking SDK call from sync code, even when an event loop is running here.

    Both SDKs refuse or warn about blocking calls made from a thread that runs
    an event loop; a factory may be called from one. Then the call runs on a
    worker thread (the caller still waits: this is start-up work).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tracerl-sdk") as pool:
        return pool.submit(fn).result()


class SamplerSlot(Generic[ClientT]):
    """The sampling client serving the current weights, and their version.

    ``current()`` hands out the client and version together; ``rebind()``
    swaps in a new client and bumps the version atomically. A request that
    took the old pair keeps using it, so requests in flight during a swap
    finish on the weights they started with and report that version.
    """

    def __init__(self, client: ClientT, version: int = 0) -> None:
        self._lock = threading.Lock()
        self._client = client
        self._version = version

    def current(self) -> tuple[ClientT, int]:
        """The client and the weight version it serves."""
        with self._lock:
            return self._client, self._version

    @property
    def version(self) -> int:
        """Weight version of the current client."""
        with self._lock:
            return self._version

    def rebind(self, client: ClientT, version: int | None = None) -> int:
        """Serve ``client`` from now on; returns the new weight version: ``version`` when
        given (the version a resumed checkpoint was saved at), else the previous one + 1."""
        with self._lock:
            self._client = client
            self._version = self._version + 1 if version is None else version
            return self._version


def missing_keys_error(
    backend: str, missing: Mapping[str, str], *, docs: str
) -> ConfigError:
    """A ``ConfigError`` naming every missing required key and how to set each.

    Args:
        backend: Backend name, e.g. ``"sagemaker"``.
        missing: Key (as users write it, e.g. ``backend.role_arn``) to a hint.
        docs: Where the keys are documented.
    """
    lines = [f"  {key}: {hint}" for key, hint in missing.items()]
    return ConfigError(
        f"backend {backend!r} is missing required config: {', '.join(missing)}.\n"
        + "\n".join(lines)
        + f"\nSee {docs}. Nothing was sent to the service."
    )

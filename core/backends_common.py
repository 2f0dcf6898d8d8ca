"""What the remote "we drive" backends (Tinker, SageMaker) really share.

Both SDKs take Tinker-shaped datums and hand back futures, but they differ in
details that break a naive shared adapter (see ``docs/backends/``). This module
holds only the SDK-free parts; each plugin keeps its SDK's differences explicit:

- ``loss_inputs``: a ``core.types.Datum`` as named, typed, shaped arrays, for the
  keys a loss needs. Which keys is the caller's choice (Tinker's RL losses take
  no ``weights``; SageMaker's losses all require them).
- ``masked_advantages``: advantages multiplied by the loss mask, for SDKs whose
  RL losses have no ``weights`` input.
- ``clip_thresholds``: core's ``clip_low``/``clip_high`` (PPO epsilons) as the
  ratio bounds both SDKs call ``clip_low_threshold``/``clip_high_threshold``,
  keeping only the keys an SDK accepts for a loss.
- ``await_result`` / ``call_blocking``: resolve an SDK future from async code
  with a deadline, wrapping SDK exceptions in tracerl's own.
- ``SamplerSlot``: the current sampling client and its weight version, swapped
  atomically so requests already in flight finish on the client they started on.
- ``missing_keys_error``: one ``ConfigError`` naming every missing required key.

Nothing here imports an SDK, torch or boto3.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from core.errors import ConfigError, TracerlError, TrainingError
from core.interfaces import LOSS_NAMES
from core.types import Datum, FinishReason

T = TypeVar("T")
ClientT = TypeVar("ClientT")

LOSS_INPUT_DTYPES: dict[str, str] = {
    "target_tokens": "int64",
    "weights": "float32",
    "logprobs": "float32",
    "advantages": "float32",
}
"""Wire dtype of every per-token loss input a ``Datum`` carries."""


@dataclass(frozen=True)
class LossInput:
    """One per-token loss input: flat data, its dtype name and its shape."""

    data: list[int] | list[float]
    """Values, one per position of ``model_input``."""
    dtype: str
    """``int64`` or ``float32``."""
    shape: list[int]
    """``[len(data)]``: every loss input is one-dimensional."""


def check_loss_fn(loss_fn: str, *, backend: str) -> str:
    """Return ``loss_fn`` or raise ``ConfigError`` naming the losses ``backend`` supports."""
    if loss_fn not in LOSS_NAMES:
        raise ConfigError(
            f"backend {backend!r} has no loss {loss_fn!r}; use one of {', '.join(LOSS_NAMES)} "
            "(algorithm.loss)"
        )
    return loss_fn


def masked_advantages(datum: Datum) -> list[float]:
    """Advantages with the loss mask applied (0.0 where ``weights`` is 0).

    ``Datum`` already carries 0.0 advantages outside generated tokens, but a
    caller may set a fractional weight; folding it in keeps the mask exact for
    losses that take no ``weights`` input.
    """
    return [a * w for a, w in zip(datum.advantages, datum.weights, strict=True)]


def loss_inputs(
    datum: Datum,
    keys: Iterable[str],
    *,
    overrides: Mapping[str, list[float]] | None = None,
) -> dict[str, LossInput]:
    """The loss inputs ``keys`` of ``datum`` as typed, shaped arrays.

    Args:
        datum: The training example (already shifted: targets are ``token_ids[1:]``).
        keys: Which inputs to produce, among ``LOSS_INPUT_DTYPES``.
        overrides: Replacement values for some keys (e.g. masked advantages).
    """
    overrides = overrides or {}
    out: dict[str, LossInput] = {}
    n = len(datum.model_input)
    for key in keys:
        if key not in LOSS_INPUT_DTYPES:
            raise ValueError(f"unknown loss input {key!r}; known: {sorted(LOSS_INPUT_DTYPES)}")
        raw = overrides.get(key, getattr(datum, key))
        dtype = LOSS_INPUT_DTYPES[key]
        data: list[int] | list[float] = (
            [int(v) for v in raw] if dtype == "int64" else [float(v) for v in raw]
        )
        if len(data) != n:
            raise ValueError(f"loss input {key!r} has {len(data)} values for {n} input tokens")
        out[key] = LossInput(data=data, dtype=dtype, shape=[n])
    return out


CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
"""The ``loss_fn_config`` keys both SDKs take for ``ppo`` and ``cispo``."""


def clip_thresholds(
    loss_fn: str,
    loss_config: Mapping[str, float] | None,
    accepted: Mapping[str, tuple[str, ...]],
) -> dict[str, float]:
    """Translate core's loss settings into an SDK's ``loss_fn_config`` for ``loss_fn``.

    Core (``algorithm.loss_config``) speaks PPO epsilons: the ratio is clipped
    to ``[1 - clip_low, 1 + clip_high]``. Tinker and SageMaker take the ratio
    bounds themselves as ``clip_low_threshold`` / ``clip_high_threshold``;
    keys already in that form pass through. Only keys in ``accepted[loss_fn]``
    are kept: the services refuse unknown config keys, and core adds settings
    (e.g. ``temperature``) some backends use and these do not.
    """
    if not loss_config:
        return {}
    out: dict[str, float] = {}
    for key, value in loss_config.items():
        if key == "clip_low":
            out.setdefault("clip_low_threshold", 1.0 - float(value))
        elif key == "clip_high":
            out.setdefault("clip_high_threshold", 1.0 + float(value))
        else:
            out[key] = float(value)
    keep = set(accepted.get(loss_fn, ()))
    return {k: v for k, v in out.items() if k in keep}


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

    def rebind(self, client: ClientT) -> int:
        """Serve ``client`` from now on; returns the new weight version."""
        with self._lock:
            self._client = client
            self._version += 1
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


def cfg_get(node: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a DictConfig, dataclass or dict node, with a default."""
    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(key, default)
    getter = getattr(node, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            return default
    return getattr(node, key, default)

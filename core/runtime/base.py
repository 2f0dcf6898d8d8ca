"""``RuntimeBase``: the lifecycle and cancellation contract of the built-in runtimes, in one place.

Defines ``RuntimeBase`` (what ``local``, ``ray`` and ``agentcore`` share) and
``RolloutClock`` (when a rollout's own time began).

The contract (``core.interfaces.RolloutRuntime`` asks it of every runtime):

- ``start`` is idempotent; a closed runtime refuses to start again
  (``RuntimeStartError``): build a new one.
- ``run_rollout`` before ``start`` or after ``aclose`` is refused as a
  ``REJECTED`` result, never an exception.
- ``cancel(rollout_id)`` cancels the task running that rollout, and that
  ``run_rollout`` returns a ``CRASHED`` result, "cancelled by the trainer"; its
  task is uncancelled, as asyncio asks of code that answers a cancellation.
  Unknown and finished ids are ignored. Any other cancellation (the caller's
  own, also one that arrives while the runtime cleans up after ours)
  propagates as ``CancelledError``.
- ``aclose`` cancels every rollout in flight the same way, lets them settle
  (``_settle``), then releases everything (``_shutdown``); a second call does
  nothing.

A runtime implements ``_start`` (acquire what it needs; when that fails,
release what it took and raise), ``_run`` (one rollout, its faults as results;
it restarts the clock once the rollout has a slot, so queueing is not the
rollout's time) and ``_shutdown`` (release everything; it may run after a
failed start too).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any, ClassVar

from core.errors import RuntimeStartError
from core.runtime._results import failed
from core.types import RolloutRequest, RolloutResult, RolloutStatus


class RolloutClock:
    """When a rollout's own time began (``elapsed_s`` of its result)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def restart(self) -> None:
        """The rollout got its slot: what it waited before is not its time."""
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since ``t0``."""
        return time.monotonic() - self.t0


class RuntimeBase(ABC):
    """Start, cancel and close for a rollout runtime; subclasses run the rollouts (see the module)."""

    kind: ClassVar[str]
    """The runtime's name as a refused rollout's error says it (``local``, ``ray``, ``agentcore``)."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        """Rollouts in flight: the task running each, by rollout id."""
        self._cancelled: dict[str, int] = {}
        """Rollouts ended by ``cancel``/``aclose`` (they answer with a result, not ``CancelledError``),
        each with its task's ``cancelling()`` count right after ours: a higher count is someone else's."""
        self._background: set[asyncio.Task[Any]] = set()
        """The runtime's own background work (restarts, probes); ``_cancel_background`` ends it."""
        self._started = False
        self._closed = False

    # -- what a runtime implements -----------------------------------------------------

    @abstractmethod
    async def _start(self) -> None:
        """Acquire the runtime's resources; on failure release what was taken and raise."""

    @abstractmethod
    async def _run(self, request: RolloutRequest, clock: RolloutClock) -> RolloutResult:
        """Run one rollout; agent faults come back as failed results."""

    @abstractmethod
    async def _shutdown(self) -> None:
        """Release everything ``_start`` acquired (also after a failed start)."""

    async def _settle(self) -> None:
        """Let the rollouts ``aclose`` cancelled reach their cleanup (one loop turn)."""
        await asyncio.sleep(0)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Acquire the runtime's resources; a second call does nothing.

        Raises:
            RuntimeStartError: the runtime was closed, or it could not start.
        """
        if self._started:
            return
        if self._closed:
            raise RuntimeStartError(f"this {type(self).__name__} was closed; create a new one")
        await self._start()
        self._started = True

    async def aclose(self) -> None:
        """Cancel rollouts in flight (each returns its cancelled result), then release everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        for rollout_id, task in list(self._tasks.items()):
            self._cancel_task(rollout_id, task)
        await self._settle()
        await self._shutdown()
        self._started = False

    async def cancel(self, rollout_id: str) -> None:
        """Stop a rollout in flight; its ``run_rollout`` returns ``CRASHED``, cancelled by the trainer."""
        task = self._tasks.get(rollout_id)
        if task is not None and not task.done():
            self._cancel_task(rollout_id, task)

    def _cancel_task(self, rollout_id: str, task: asyncio.Task[Any]) -> None:
        task.cancel()
        self._cancelled[rollout_id] = task.cancelling()

    async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
        """Run one rollout; never raises for agent faults (see ``RolloutRuntime``)."""
        rid = request.rollout_id
        if not self._started or self._closed:
            state = "closed" if self._closed else "not started; await runtime.start() first"
            return failed(rid, RolloutStatus.REJECTED, f"the {self.kind} runtime is {state}", 0.0)
        task = asyncio.current_task()
        assert task is not None
        self._tasks[rid] = task
        clock = RolloutClock()
        try:
            return await self._run(request, clock)
        except asyncio.CancelledError:
            ours = self._cancelled.get(rid)
            if ours is None or task.cancelling() > ours:
                raise  # not ours, or cancelled again since ours: the caller's own
            task.uncancel()  # our own cancel(): answer with a result instead of propagating
            return failed(rid, RolloutStatus.CRASHED, "cancelled by the trainer", clock.elapsed())
        finally:
            self._tasks.pop(rid, None)
            self._cancelled.pop(rid, None)

    # -- helpers for subclasses ---------------------------------------------------------

    def _cancelled_by_us(self, rollout_id: str) -> bool:
        """True when ``cancel``/``aclose`` ended this rollout (its cleanup may reach the agent)."""
        return rollout_id in self._cancelled

    def _settled(self, rollout_id: str) -> None:
        """The rollout's outcome is decided: ``cancel`` and ``aclose`` leave it alone from now on.

        A runtime whose cleanup awaits (agentcore stopping its session) calls this
        first, so that a late cancel cannot turn a finished rollout into a cancelled one.
        """
        self._tasks.pop(rollout_id, None)

    def _background_running(self, name: str) -> bool:
        """True while a background task of that name runs."""
        return any(t.get_name() == name for t in self._background)

    def _in_background(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coro`` as background task ``name``; ``_cancel_background`` ends it."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()

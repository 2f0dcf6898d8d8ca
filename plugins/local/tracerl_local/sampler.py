"""The local sampler: concurrent ``sample`` calls batched dynamically onto one model.

Many gateway sessions call ``sample`` at once from one event loop. A
background task takes the first waiting request, waits ``batch_wait_ms`` for
more, and runs the whole batch (up to ``max_batch_size``) through
``generate_batch`` in a worker thread, so the event loop keeps serving HTTP
while the model runs. Requests that arrive meanwhile form the next batch.

Weights: the sampler owns a copy of the policy (a ``_Snapshot`` with its
weight version). A batch pins the snapshot it started on, so ``publish``
(called by ``LocalBackend.sync_sampler``) never changes weights under a
running batch: it copies in place when no batch holds the snapshot, and
otherwise builds a fresh copy and lets the old one go when its batch ends.

What a running batch does when new weights are published (``on_update``):

- ``continue`` (the default; partial rollouts): it stops after its current
  decode step, and each unfinished generation goes on in the next batch from
  its prompt plus the tokens generated so far, prefilled and decoded under the
  new weights (no key/value computed by the old ones is reused). Its result
  carries one ``Segment`` per weight version, each token with the logprob of
  the weights that sampled it.
- ``abort``: unfinished generations end there with their tokens so far and
  ``FinishReason.ABORT`` (what an engine's abort-on-update answers; the caller
  may send prompt plus tokens again).
- ``finish``: the batch finishes on the weights it started with.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from core.errors import ContextLengthError, SamplerError
from core.tokenizer import end_of_turn_ids
from core.types import FinishReason, SampleResult, SamplingParams, Segment
from tracerl_local.generate import GenOutput, GenRequest, generate_batch
from tracerl_local.model import cache_argument

log = logging.getLogger(__name__)


@dataclass
class SamplerStats:
    """Counters that show batching at work (the tests and the benchmark read them)."""

    requests: int = 0
    """Requests served."""
    batches: int = 0
    """Batches run."""
    forward_calls: int = 0
    """Model forward passes (prefill + decode steps) over all batches."""
    largest_batch: int = 0
    """Most requests served by one batch."""
    interrupted: int = 0
    """Generations a weight update interrupted (continued or aborted)."""


@dataclass
class _Snapshot:
    model: torch.nn.Module
    version: int
    active: int = 0
    interrupt: str = ""
    """Set by ``publish`` while batches run on it: ``continue`` or ``abort`` them."""


ON_UPDATE = ("continue", "abort", "finish")
"""What a running batch does when new weights are published (module docstring)."""


@dataclass
class _Pending:
    request: GenRequest
    future: asyncio.Future[SampleResult]
    session_id: str = field(default="")
    token_ids: list[int] = field(default_factory=list)
    """Tokens earlier, interrupted parts of this generation produced."""
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    """One per earlier part, with the version that sampled it."""

    def result(self, ids: list[int], logprobs: list[float], finish: FinishReason, version: int) -> SampleResult:
        """The whole generation: the earlier parts, then ``ids`` sampled under ``version``."""
        if not self.segments:
            return SampleResult(ids, logprobs, finish, version)
        segments = list(self.segments)
        if ids:
            n = len(self.token_ids)
            segments.append(Segment(n, n + len(ids), version))
        return SampleResult(
            [*self.token_ids, *ids],
            [*self.logprobs, *logprobs],
            finish,
            segments[0].weight_version,
            segments=tuple(segments) if len(segments) > 1 else (),
        )

    def continued(self, ids: list[int], logprobs: list[float], version: int) -> _Pending:
        """This generation to go on after ``ids`` (sampled under ``version``) on new weights."""
        n = len(self.token_ids)
        req = self.request
        return _Pending(
            GenRequest(
                [*req.prompt, *ids],
                replace(req.params, max_tokens=req.params.max_tokens - len(ids)),
                generated=[*req.generated, *ids],
                rng=req.rng,
            ),
            self.future,
            self.session_id,
            [*self.token_ids, *ids],
            [*self.logprobs, *logprobs],
            [*self.segments, Segment(n, n + len(ids), version)],
        )


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A gradient-free eval-mode copy of ``model`` for serving."""
    clone = copy.deepcopy(model)
    for p in clone.parameters():
        p.grad = None
        p.requires_grad_(False)
    return clone.eval()


class LocalSampler:
    """``core.interfaces.Sampler`` over a local torch model, with dynamic batching."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        *,
        max_positions: int,
        max_batch_size: int = 256,
        batch_wait_ms: float = 2.0,
        seed: int = 0,
        version: int = 0,
        context_setting: str = "the model's max_position_embeddings",
        on_update: str = "continue",
    ) -> None:
        """Serve a frozen copy of ``model`` (the caller keeps training the original).

        ``context_setting`` names where ``max_positions`` comes from, for the error a
        prompt that does not fit gets. ``on_update``: what a running batch does when
        ``publish`` serves new weights (``continue``, ``abort`` or ``finish``; see the
        module docstring).
        """
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size!r}")
        if on_update not in ON_UPDATE:
            raise ValueError(f"on_update must be one of {ON_UPDATE}, got {on_update!r}")
        self.on_update = on_update
        self._tokenizer = tokenizer
        # Every end-of-turn id the model declares (not only EOS), so no row runs past its turn.
        self.end_of_turn_ids = end_of_turn_ids(
            tokenizer, generation_config=getattr(model, "generation_config", None)
        )
        self._vocab = len(tokenizer)  # type: ignore[arg-type]
        self._max_positions = max_positions
        self._context_setting = context_setting
        self._max_batch = max_batch_size
        self._wait_s = max(batch_wait_ms, 0.0) / 1000.0
        self._rng = torch.Generator().manual_seed(seed)
        self._cache_arg = cache_argument(model)
        self._lock = threading.Lock()
        self._current = _Snapshot(frozen_copy(model), version)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracerl-sampler")
        self._carry: list[_Pending] = []  # interrupted generations, first in the next batch
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.stats = SamplerStats()

    @property
    def weight_version(self) -> int:
        """Version of the weights new batches use."""
        return self._current.version

    @property
    def model(self) -> torch.nn.Module:
        """The frozen model new batches run on (read-only; for tests)."""
        return self._current.model

    def publish(self, source: torch.nn.Module, version: int, *, on_update: str | None = None) -> None:
        """Serve ``source``'s current weights as ``version`` from the next batch on.

        Thread-safe. A batch already running never has its weights changed under it;
        it continues its generations on the new ones, aborts them or finishes them
        as ``on_update`` (default: the sampler's) says.
        """
        mode = self.on_update if on_update is None else on_update
        if mode not in ON_UPDATE:
            raise ValueError(f"on_update must be one of {ON_UPDATE}, got {mode!r}")
        with self._lock:
            snap = self._current
            if snap.active == 0:
                with torch.no_grad():
                    snap.model.load_state_dict(source.state_dict())
                snap.version = version
            else:
                self._current = _Snapshot(frozen_copy(source), version)
                if mode != "finish":
                    snap.interrupt = mode

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str,
    ) -> SampleResult:
        """Continue ``prompt_token_ids``; see ``core.interfaces.Sampler``.

        A row stops on any of ``end_of_turn_ids`` or ``params.stop_token_ids``.

        Logprobs are those of the distribution the token was drawn from: after
        temperature, top-k and top-p (renormalised). With temperature 0 the
        token is the argmax and its logprob is the temperature-1 one.

        Raises:
            ContextLengthError: the prompt fills the context.
            SamplerError: empty prompt, sampler closed, or the model failed.
        """
        if self._closed:
            raise SamplerError("the local sampler is closed; build a new backend to sample again")
        prompt = list(prompt_token_ids)
        if not prompt:
            raise SamplerError(
                f"session {session_id!r}: the prompt is empty; send at least one token"
            )
        if len(prompt) >= self._max_positions:
            raise ContextLengthError(
                f"context_length_exceeded: session {session_id!r} sent {len(prompt)} prompt tokens "
                f"but the model's context is {self._max_positions} ({self._context_setting}); "
                "raise it, or shorten the prompt and history",
                prompt_tokens=len(prompt),
                context=self._max_positions,
                setting=self._context_setting,
            )
        vocab = self._vocab
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise SamplerError(
                f"session {session_id!r}: token ids {bad[:5]!r} are outside the vocabulary [0, {vocab})"
            )
        queue = self._ensure_worker()
        loop = asyncio.get_running_loop()
        pending = _Pending(GenRequest(prompt, params), loop.create_future(), session_id)
        await queue.put(pending)
        return await pending.future

    def _ensure_worker(self) -> asyncio.Queue[_Pending]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            # First call, or a new event loop (each asyncio.run has its own).
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run(self._queue), name="tracerl-local-sampler")
        assert self._queue is not None
        return self._queue

    async def _run(self, queue: asyncio.Queue[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Interrupted generations go first and at once: they are mid-turn.
            batch, self._carry = self._carry, []
            if not batch:
                batch = [await queue.get()]
                if self._wait_s:
                    await asyncio.sleep(self._wait_s)
            while len(batch) < self._max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            batch = [p for p in batch if not p.future.done()]  # callers that gave up
            if not batch:
                continue
            try:
                await loop.run_in_executor(self._executor, self._generate, loop, batch)
            except Exception as exc:  # the model failed: fail this batch, keep serving
                log.exception("local sampler batch of %d failed", len(batch))
                err = SamplerError(f"local sampler failed on a batch of {len(batch)}: {exc!r}")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)

    def _generate(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        with self._lock:
            snap = self._current
            snap.active += 1
        stats = self.stats  # counted before results go out, so callers see them complete
        stats.batches += 1
        stats.requests += sum(1 for p in batch if not p.segments)  # continuations are not new
        stats.largest_batch = max(stats.largest_batch, len(batch))
        carry: list[_Pending] = []

        def done(i: int, out: GenOutput) -> None:
            p = batch[i]
            if out.finish_reason is FinishReason.ABORT and snap.interrupt:
                stats.interrupted += 1
                if snap.interrupt == "continue" and not self._closed:
                    carry.append(p.continued(out.token_ids, out.logprobs, snap.version))
                    return
            result = p.result(out.token_ids, out.logprobs, out.finish_reason, snap.version)
            try:
                loop.call_soon_threadsafe(_resolve, p.future, result)
            except RuntimeError:  # the caller's event loop is gone; nobody waits
                pass

        def forward() -> None:
            stats.forward_calls += 1

        try:
            generate_batch(
                snap.model,
                [p.request for p in batch],
                tokenizer=self._tokenizer,
                max_positions=self._max_positions,
                cache_arg=self._cache_arg,
                rng=self._rng,
                on_done=done,
                on_forward=forward,
                eos_ids=self.end_of_turn_ids,
                interrupted=lambda: bool(snap.interrupt),
            )
        finally:
            with self._lock:
                snap.active -= 1
            self._carry.extend(carry)

    async def aclose(self) -> None:
        """Stop the batching task, fail waiting requests, release the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None and not self._worker.done():
            worker_loop = self._worker.get_loop()
            if worker_loop is asyncio.get_running_loop():
                self._worker.cancel()
                try:
                    await self._worker
                except asyncio.CancelledError:
                    pass
        self._executor.shutdown(wait=True)
        for p in self._carry:  # interrupted generations that will not go on
            if not p.future.done():
                p.future.set_exception(SamplerError("the local sampler was closed"))
        self._carry = []
        if self._queue is not None:
            while not self._queue.empty():
                p = self._queue.get_nowait()
                if not p.future.done():
                    p.future.set_exception(SamplerError("the local sampler was closed"))


def _resolve(future: asyncio.Future[SampleResult], result: SampleResult) -> None:
    if not future.done():
        future.set_result(result)

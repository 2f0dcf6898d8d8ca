"""What each rollout of a run did, kept under ``<run_dir>/traces/`` for ``python -m core.view``.

Metrics say *that* reward did not rise; traces say *why*: which rollouts failed
and how, what the agent said and called, which tokens were trained, their
logprobs and the weights that produced them. One gzip'd JSONL file per stored
step (``step_000012.jsonl.gz``) and per evaluation (``eval_000050.jsonl.gz``):

- line 1, the header: ``format``, ``kind`` (``train`` or ``eval``), ``step``,
  ``time``, ``rollouts``, ``weight_version`` (the weights a training step
  trained) and ``tokens`` (``{id: text}`` of every token id the
  file uses, decoded one by one, so the viewer needs no tokenizer);
- one line per rollout: ids, payload (its ``_config`` dropped), status, reward,
  advantage, error, elapsed seconds, agent metrics, session faults, the
  conversation tree the gateway recorded (``conversation``: nodes in preorder,
  each ``{"parent", "messages", "turn"}``; a node with several children is a
  fork) and the trace rows.

A row stores ``token_ids`` after the prefix it shares with an earlier row of the
same rollout (``base: [row, n]``: the first n tokens are that row's), the loss
mask as ``[start, end)`` runs, ``logprobs`` only where the mask is 1 (rounded to
``LOGPROB_DECIMALS``), turns as ``[start, end, finish_reason, weight_version]``
followed by the turn's further fields when it has any: a list ``[[start, end,
weight_version], ...]`` for a turn a weight update interrupted (its segments), and an
object of named fields (``parse``, and ``parse_detail`` when not empty:
``core.types.ParseStatus``; ``policy`` when not ``DEFAULT_POLICY``); files written before
them hold four-item turns, read back with those fields unset (the policy as
``DEFAULT_POLICY``), and readers ignore names they do not know. Then the
gateway's metadata. ``rows_of`` rebuilds the exact ``TraceRecord``s.

A trace is never fatal to a run: values orjson cannot write (integers outside
64 bits, containers nested deeper than ``STORED_DEPTH``; both arrive from
datasets, agents and model-written tool calls) are stored as what they can be
(a big integer as its decimal string, a too-deep container as ``TRUNCATED``),
and a record that still cannot be written keeps its ids and an ``error``.

A file is written to a ``.tmp`` name and renamed, so a reader never sees half
of one; ``read_traces`` still tolerates a file cut short (a copy in progress, a
full disk) and returns the rollouts before the cut with ``partial=True``. A
resumed run rewrites the steps it replays. Only the newest ``trainer.keep_traces``
training-step files are kept (older ones are deleted as new ones are written);
evaluations are all kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import gzip
import logging
import math
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from core.errors import ConfigError
from core.gateway.harvest import (
    conversation_tree as conversation_tree,  # readers of traces import it here
)
from core.types import (
    DEFAULT_POLICY,
    FinishReason,
    ParseStatus,
    RolloutStatus,
    Segment,
    TraceRecord,
    TurnSpan,
)

TRACES_DIR = "traces"
"""Subdirectory of the run directory holding the trace files."""
FORMAT = 1
"""Version of the file layout, in every header."""
LOGPROB_DECIMALS = 6
"""Stored logprobs are rounded to this many decimals (1e-6 nats)."""
ERROR_CHARS = 8000
"""Longest error text kept per rollout (its tail: tracebacks end with the cause)."""
KINDS = ("train", "eval")
"""What a trace file holds: a training step's rollouts or an evaluation's."""

STORED_DEPTH = 200
"""Deepest nesting stored; deeper containers become ``TRUNCATED`` (orjson stops at 255)."""
TRUNCATED = "[truncated: nested too deep to store]"
"""What stands for a container nested deeper than ``STORED_DEPTH``."""

_DUMP = orjson.OPT_NON_STR_KEYS
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson writes as a JSON integer
_log = logging.getLogger(__name__)
_NAME = re.compile(r"^(train|eval)_(\d{6,})\.jsonl\.gz$")


def trace_path(run_dir: Path, kind: str, step: int) -> Path:
    """Where the traces of ``kind`` at ``step`` live."""
    if kind not in KINDS:
        raise ValueError(f"trace kind must be one of {KINDS}, got {kind!r}")
    return Path(run_dir) / TRACES_DIR / f"{kind}_{int(step):06d}.jsonl.gz"


def list_traces(run_dir: Path) -> dict[str, list[int]]:
    """The stored steps of each kind, ascending (``.tmp`` files being written are left out)."""
    found: dict[str, list[int]] = {k: [] for k in KINDS}
    folder = Path(run_dir) / TRACES_DIR
    if folder.is_dir():
        for entry in folder.iterdir():
            m = _NAME.match(entry.name)
            if m:
                found[m.group(1)].append(int(m.group(2)))
    return {k: sorted(v) for k, v in found.items()}


# -- encoding ------------------------------------------------------------------


def _runs(mask: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append([start, i])
            start = None
    if start is not None:
        runs.append([start, len(mask)])
    return runs


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode_turn(turn: TurnSpan) -> list[Any]:
    """``[start, end, finish_reason, weight_version]``, plus ``[[start, end, version], ...]``
    when a weight update interrupted the turn (its segments), plus an object of its named
    fields when it has any (see the module docstring)."""
    out: list[Any] = [turn.start, turn.end, str(turn.finish_reason), turn.weight_version]
    if turn.segments:
        out.append([[g.start, g.end, g.weight_version] for g in turn.segments])
    extra: dict[str, Any] = {}
    if turn.parse is not None:
        extra["parse"] = str(turn.parse)
        if turn.parse_detail:
            extra["parse_detail"] = turn.parse_detail
    if turn.policy != DEFAULT_POLICY:
        extra["policy"] = turn.policy
    if extra:
        out.append(extra)
    return out


def decode_turn(stored: Sequence[Any]) -> TurnSpan:
    """The ``TurnSpan`` ``encode_turn`` stored. Four-item turns (files written before
    segments and parse statuses) have neither; a parse status this version does not know
    reads as none."""
    s, e, f, v = stored[:4]
    segments: tuple[Segment, ...] = ()
    extra: Mapping[str, Any] = {}
    for item in stored[4:]:
        if isinstance(item, Mapping):
            extra = item
        elif isinstance(item, list):
            segments = tuple(Segment(int(a), int(b), int(w)) for a, b, w in item)
    try:
        parse = ParseStatus(extra["parse"]) if extra.get("parse") is not None else None
    except ValueError:
        parse = None
    detail = str(extra.get("parse_detail") or "")
    policy = str(extra.get("policy") or DEFAULT_POLICY)
    return TurnSpan(int(s), int(e), FinishReason(f), int(v), segments, parse, detail, policy)


def encode_rows(rows: Sequence[TraceRecord]) -> list[dict[str, Any]]:
    """The stored form of one rollout's rows (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        base: list[int] | None = None
        best = 0
        for j in range(i):
            n = _common_prefix(rows[j].token_ids, row.token_ids)
            if n > best:
                base, best = [j, n], n
        out.append(
            {
                "row_index": row.row_index,
                "session_id": row.session_id,
                "prompt_length": row.prompt_length,
                "base": base,
                "token_ids": list(row.token_ids[best:]),
                "mask": _runs(row.loss_mask),
                "logprobs": [
                    round(lp, LOGPROB_DECIMALS) for lp, m in zip(row.logprobs, row.loss_mask, strict=True) if m
                ],
                "turns": [encode_turn(t) for t in row.turns],
                "metadata": row.metadata,
            }
        )
    return out


def decode_rows(stored: Sequence[Mapping[str, Any]], rollout: Mapping[str, Any] | None = None) -> list[TraceRecord]:
    """``TraceRecord``s from their stored form; ``rollout`` (the rollout's record) fills
    ``rollout_id``, ``group_id``, ``reward`` and ``status``."""
    rollout = rollout or {}
    status = rollout.get("status")
    full: list[list[int]] = []
    records: list[TraceRecord] = []
    for row in stored:
        ids = list(row["token_ids"])
        if row.get("base"):
            j, n = row["base"]
            ids = full[j][:n] + ids
        full.append(ids)
        mask = [0] * len(ids)
        for s, e in row["mask"]:
            mask[s:e] = [1] * (e - s)
        logprobs = [0.0] * len(ids)
        it = iter(row["logprobs"])
        for k, m in enumerate(mask):
            if m:
                logprobs[k] = float(next(it))
        records.append(
            TraceRecord(
                session_id=str(row.get("session_id", "")),
                token_ids=ids,
                loss_mask=mask,
                logprobs=logprobs,
                prompt_length=int(row["prompt_length"]),
                turns=[decode_turn(t) for t in row["turns"]],
                row_index=int(row.get("row_index", len(records))),
                rollout_id=rollout.get("rollout_id"),
                group_id=rollout.get("group_id"),
                reward=rollout.get("reward") if status == RolloutStatus.OK.value else None,
                status=RolloutStatus(status) if status else None,
                metadata=dict(row.get("metadata") or {}),
            )
        )
    return records


def rows_of(rollout: Mapping[str, Any]) -> list[TraceRecord]:
    """The ``TraceRecord`` rows of one stored rollout."""
    return decode_rows(rollout.get("rows", []), rollout)


def full_token_ids(rollout: Mapping[str, Any]) -> list[list[int]]:
    """Each stored row's whole token id list (its shared prefix put back)."""
    return [r.token_ids for r in rows_of(rollout)]


def encode_rollout(outcome: Any, advantage: float | None) -> dict[str, Any]:
    """One rollout's stored record; ``outcome`` is a ``RolloutOutcome``."""
    request, result = outcome.request, outcome.result
    payload = {k: v for k, v in dict(request.payload).items() if k != "_config"}
    error = result.error
    if error and len(error) > ERROR_CHARS:
        error = "[...]" + error[-ERROR_CHARS:]
    return {
        "rollout_id": request.rollout_id,
        "group_id": request.group_id,
        "payload": payload,
        "status": str(result.status),
        "reward": _finite(result.reward),
        "advantage": _finite(advantage),
        "error": error,
        "elapsed_s": round(float(result.elapsed_s), 4),
        "metrics": result.metrics,
        "faults": getattr(outcome, "faults", {}),
        "conversation": getattr(outcome, "conversation", []),
        "rows": encode_rows(outcome.rows),
    }


# -- writing -------------------------------------------------------------------


@dataclass
class TraceWriter:
    """Writes a run's trace files; ``every`` 0 writes none.

    Args:
        run_dir: The run directory.
        every: Store the rollouts of every N-th training step (``trainer.save_traces``);
            evaluations are stored whenever ``every`` > 0.
        decode: Text of a list of token ids (the gateway's ``renderer.decode``); each id
            is decoded once per run and kept.
        keep: Most training-step files kept (``trainer.keep_traces``): after each write,
            older ones are deleted; 0 keeps all. Evaluations are all kept.
    """

    run_dir: Path
    every: int = 1
    decode: Callable[[Sequence[int]], str] | None = None
    keep: int = 0
    _texts: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ConfigError(
                f"trainer.save_traces must be an integer >= 0 (0: off, 1: every step, N: every "
                f"N-th step), got {self.every!r}"
            )
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 0:
            raise ConfigError(
                f"trainer.keep_traces must be an integer >= 0 (the newest N training steps' traces "
                f"are kept; 0: all), got {self.keep!r}"
            )

    def wants(self, kind: str, step: int) -> bool:
        """Whether the rollouts of ``kind`` at ``step`` are stored."""
        if self.every <= 0:
            return False
        return kind == "eval" or step % self.every == 0

    def _decode_new(self, ids: Iterable[int]) -> None:
        """Decode and keep the text of each of ``ids`` (not yet known) one by one."""
        for i in ids:
            try:
                text = self.decode([i]) if self.decode is not None else ""
            except Exception:  # an id the tokenizer cannot decode: show the id instead
                text = ""
            self._texts[i] = text

    def _encode(
        self, outcomes: Sequence[Any], advantages: Mapping[str, float]
    ) -> tuple[list[dict[str, Any]], list[int], list[int]]:
        """The stored records, every token id they use, and the ids not decoded yet."""
        records = [encode_rollout(o, advantages.get(o.request.rollout_id)) for o in outcomes]
        ids = sorted({i for o in outcomes for r in o.rows for i in r.token_ids})
        return records, ids, [i for i in ids if i not in self._texts]

    def _write(
        self,
        kind: str,
        step: int,
        weight_version: int | None,
        records: list[dict[str, Any]],
        ids: list[int],
        t0: float,
    ) -> dict[str, float]:
        header = {
            "format": FORMAT,
            "kind": kind,
            "step": int(step),
            "time": time.time(),
            "rollouts": len(records),
            "weight_version": weight_version,
            "tokens": {str(i): self._texts[i] for i in ids},
        }
        size = write_trace_file(trace_path(self.run_dir, kind, step), header, records)
        if kind == "train":
            self._prune(step)
        return {"traces/bytes": float(size), "time/traces": time.perf_counter() - t0}

    def _prune(self, step: int) -> None:
        """Delete the training-step files past the newest ``keep`` up to ``step``. Files of
        later steps (left by a run that crashed and is now replaying) are left alone:
        they are rewritten as the replay reaches them."""
        if self.keep <= 0:
            return
        stored = [s for s in list_traces(self.run_dir)["train"] if s <= step]
        for old in stored[: -self.keep]:
            trace_path(self.run_dir, "train", old).unlink(missing_ok=True)

    def write_step(
        self,
        step: int,
        outcomes: Sequence[Any],
        advantages: Mapping[str, float],
        *,
        kind: str = "train",
        weight_version: int | None = None,
    ) -> dict[str, float]:
        """Store ``outcomes`` (``RolloutOutcome``s) of ``kind`` at ``step`` when ``wants`` says so.

        ``weight_version``: the weights the step trained (async training samples with
        older ones; the viewer shows each rollout's lag behind it).

        Returns ``{"traces/bytes", "time/traces"}`` for the step's metrics, or ``{}``
        when nothing was stored.
        """
        if not self.wants(kind, step):
            return {}
        t0 = time.perf_counter()
        records, ids, new = self._encode(outcomes, advantages)
        self._decode_new(new)
        return self._write(kind, step, weight_version, records, ids, t0)

    async def awrite_step(
        self,
        step: int,
        outcomes: Sequence[Any],
        advantages: Mapping[str, float],
        *,
        kind: str = "train",
        weight_version: int | None = None,
    ) -> dict[str, float]:
        """``write_step`` for the training loop: encoding, compression and the write run
        in a worker thread, so the event loop (the gateway, the async rollout pool)
        keeps serving meanwhile; a large step's traces took it away for as long.

        Token ids new to this writer are decoded on the event loop, between the two
        halves: ``decode`` is the gateway's tokenizer, which is not shared with a thread.
        """
        if not self.wants(kind, step):
            return {}
        t0 = time.perf_counter()
        records, ids, new = await asyncio.to_thread(self._encode, outcomes, advantages)
        self._decode_new(new)
        return await asyncio.to_thread(self._write, kind, step, weight_version, records, ids, t0)


def storable(value: Any, depth: int = 0) -> Any:
    """``value`` with what orjson cannot write replaced: integers outside 64 bits by their
    decimal string, containers nested deeper than ``STORED_DEPTH`` by ``TRUNCATED``.

    Recursion stops at ``STORED_DEPTH``, far below Python's limit, whatever ``value`` nests.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        return value if _INT_MIN <= value <= _INT_MAX else str(value)
    if isinstance(value, enum.Enum):
        return storable(value.value, depth)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if depth >= STORED_DEPTH:
            return TRUNCATED
        if isinstance(value, Mapping):
            return {_key(k): storable(v, depth + 1) for k, v in value.items()}
        return [storable(v, depth + 1) for v in value]
    return value  # orjson writes it natively (datetime, UUID) or by its str()


def _key(key: Any) -> Any:
    """A mapping key orjson writes (``OPT_NON_STR_KEYS``): a big integer as its string."""
    if isinstance(key, int) and not isinstance(key, bool) and not _INT_MIN <= key <= _INT_MAX:
        return str(key)
    return key


def _line(record: Mapping[str, Any]) -> bytes:
    """One JSONL line; a record orjson refuses is made ``storable`` first, and one that is
    still refused keeps only its ids and the error, so no record stops the file."""
    # orjson writes NaN and infinities as null, any other type by its str()
    try:
        return orjson.dumps(record, default=str, option=_DUMP) + b"\n"
    except TypeError:
        pass  # a value orjson cannot write (a 2**64 int, nesting past its limit): made storable below
    try:
        return orjson.dumps(storable(record), default=str, option=_DUMP) + b"\n"
    except TypeError as exc:
        _log.warning("trace record %s could not be stored: %s", record.get("rollout_id"), exc)
        keep = {k: storable(record.get(k)) for k in ("rollout_id", "group_id", "status", "reward", "advantage")}
        return orjson.dumps({**keep, "error": f"trace record not storable: {exc}"}, default=str) + b"\n"


def write_trace_file(path: Path, header: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> int:
    """Write one trace file atomically (``.tmp``, then rename); returns its size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    body = b"".join(_line(r) for r in (header, *records))
    # mtime=0: the same rollouts give the same bytes. No fsync: a trace lost to a power
    # cut costs a view, not the run, and the step should not wait for the disk.
    tmp.write_bytes(gzip.compress(body, compresslevel=6, mtime=0))
    os.replace(tmp, path)
    return path.stat().st_size


# -- reading -------------------------------------------------------------------


@dataclass
class StepTraces:
    """The contents of one trace file."""

    header: dict[str, Any]
    """Format, kind, step, time, rollout count and token texts."""
    rollouts: list[dict[str, Any]]
    """One stored record per rollout, in the step's order."""
    partial: bool = False
    """The file was cut short; ``rollouts`` holds the ones before the cut."""


def read_traces(path: Path) -> StepTraces:
    """Read a trace file; a file cut short gives the rollouts before the cut.

    Raises:
        ValueError: the file is not a trace file (no readable header) or is of a
            newer format than this version reads.
    """
    data = Path(path).read_bytes()
    inflate = zlib.decompressobj(wbits=31)  # gzip framing; no error for a cut-short stream
    try:
        text = inflate.decompress(data)
    except zlib.error as exc:
        raise ValueError(f"{path} is not a readable trace file: {exc}") from exc
    partial = not inflate.eof
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines and partial:
        lines.pop()  # the line the cut went through
    if not lines:
        raise ValueError(f"{path} holds no header line; it was cut short before any rollout")
    try:
        header = orjson.loads(lines[0])
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: the header line is not JSON ({exc})") from exc
    if not isinstance(header, dict) or int(header.get("format", 0)) > FORMAT:
        raise ValueError(
            f"{path}: trace format {header.get('format') if isinstance(header, dict) else '?'} is "
            f"newer than this tracerl reads ({FORMAT}); upgrade tracerl"
        )
    rollouts: list[dict[str, Any]] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            rollouts.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            partial = True
            break
    return StepTraces(header=header, rollouts=rollouts, partial=partial)

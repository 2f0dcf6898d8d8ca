"""What the viewer page asks for, read from a run directory (while it trains, too).

``RunData`` answers three questions, each a JSON-able dict: the run's overview
(``metrics.jsonl`` plus which steps have traces), one stored step's rollouts in
summary (with how many of each rollout's turns ended in each tool-call parse
status, ``core.types.ParseStatus``, and how many each policy generated), and one
rollout in full (rows with every token's id, text, mask and logprob, the row's
policy, each turn's parse status and, for a turn a weight update interrupted, its
segments). Trace files are re-read when they change on disk, so a page refresh
sees the steps a running training wrote since.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.rundir.metrics import read_metrics
from core.rundir.traces import (
    KINDS,
    TRACES_DIR,
    StepTraces,
    decode_turn,
    list_traces,
    read_traces,
    rows_of,
    trace_path,
)
from core.types import ParseStatus, RolloutStatus, TurnSpan

_CACHE_FILES = 6


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of a stored rollout's turns ended in each parse status (only those seen).

    A turn that forked rows share is counted once, in the first row (the others hold it
    as their first ``shared_turns``); turns stored without a status are not counted."""
    counts: dict[str, int] = {}
    for row in rows:
        shared = int((row.get("metadata") or {}).get("shared_turns", 0) or 0)
        for stored in row.get("turns", [])[shared:]:
            status = decode_turn(stored).parse
            if status is not None:
                counts[status.value] = counts.get(status.value, 0) + 1
    return {s.value: counts[s.value] for s in ParseStatus if s.value in counts}


def policy_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of a stored rollout's turns each policy generated (``TurnSpan.policy``),
    by policy name; a turn forked rows share is counted once, as in ``parse_counts``."""
    counts: dict[str, int] = {}
    for row in rows:
        shared = int((row.get("metadata") or {}).get("shared_turns", 0) or 0)
        for stored in row.get("turns", [])[shared:]:
            policy = decode_turn(stored).policy
            counts[policy] = counts.get(policy, 0) + 1
    return dict(sorted(counts.items()))


def _stored_versions(turn: Sequence[Any]) -> list[int]:
    """The weight versions of a stored turn (``core.rundir.traces.encode_turn``): its
    segments' when a weight update interrupted it, else its own."""
    for item in turn[4:]:
        if isinstance(item, list) and item:
            return [int(g[2]) for g in item]
    return [int(turn[3])]


def _parse_of(turn: TurnSpan) -> dict[str, str] | None:
    """A turn's parse status for the page; None when its trace recorded none."""
    if turn.parse is None:
        return None
    return {"status": turn.parse.value, "detail": turn.parse_detail}


def find_run_dir(path: Path) -> Path:
    """``path`` itself when it is a run directory, else a clear error.

    A run directory holds ``metrics.jsonl`` or ``traces/``. Pointed at a folder of
    runs (``outputs/``), the error names the newest runs inside it.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist; pass a run directory (the run_dir a training printed)")
    if (path / "metrics.jsonl").exists() or (path / TRACES_DIR).is_dir():
        return path
    runs = sorted(
        (p.parent for p in path.glob("**/metrics.jsonl")), key=lambda p: p.stat().st_mtime, reverse=True
    )
    hint = (
        "; runs inside it, newest first: " + ", ".join(str(r) for r in runs[:5])
        if runs
        else "; it holds no run either"
    )
    raise ConfigError(f"{path} is not a run directory (no metrics.jsonl, no traces/){hint}")


class RunData:
    """Reads one run directory for the viewer; safe to share between server threads."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = find_run_dir(run_dir)
        self._lock = threading.Lock()
        self._files: OrderedDict[Path, tuple[tuple[int, int], StepTraces]] = OrderedDict()

    def _load(self, kind: str, step: int) -> StepTraces:
        if kind not in KINDS:
            raise KeyError(f"kind must be one of {KINDS}, got {kind!r}")
        path = trace_path(self.run_dir, kind, step)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise self._missing(kind, step) from None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._files.get(path)
            if hit is not None and hit[0] == stamp:
                self._files.move_to_end(path)
                return hit[1]
        try:
            traces = read_traces(path)
        except FileNotFoundError:  # deleted since the stat: the run's retention removed it
            raise self._missing(kind, step) from None
        with self._lock:
            self._files[path] = (stamp, traces)
            while len(self._files) > _CACHE_FILES:
                self._files.popitem(last=False)
        return traces

    def _missing(self, kind: str, step: int) -> KeyError:
        """The not-found error for ``kind`` at ``step``, saying which steps are stored."""
        stored = list_traces(self.run_dir)[kind]
        if not stored:
            return KeyError(f"no {kind} traces stored for step {step} (this run stored none)")
        why = (
            "; a run keeps only its newest training steps' traces (trainer.keep_traces)"
            if kind == "train" and step < stored[-1]
            else ""
        )
        return KeyError(
            f"no {kind} traces stored for step {step}: stored are {len(stored)} steps, "
            f"from {stored[0]} to {stored[-1]}{why}"
        )

    def overview(self) -> dict[str, Any]:
        """Per-step numeric metrics, eval results, status totals and the stored steps."""
        records = read_metrics(self.run_dir / "metrics.jsonl")
        steps: list[dict[str, Any]] = []
        evals: list[dict[str, Any]] = []
        for r in records:
            numeric = {k: v for k, v in r.items() if _number(v) or (k.startswith("reward") and v is None)}
            if "reward/mean" in r:
                steps.append(numeric)
            if _number(r.get("eval/reward_mean")) or "eval/failed" in r:
                evals.append(
                    {"step": r.get("step", 0), "reward": r.get("eval/reward_mean"), "failed": r.get("eval/failed")}
                )
        statuses = {
            s.value: int(sum(int(r.get(f"rollouts/{s.value}", 0) or 0) for r in steps))
            for s in RolloutStatus
            if s is not RolloutStatus.OK
        }
        statuses = {"ok": int(sum(int(r.get("rollouts/ok", 0) or 0) for r in steps)), **statuses}
        try:
            stamp = os.stat(self.run_dir / "metrics.jsonl").st_mtime
        except OSError:
            stamp = 0.0
        return {
            "run_dir": str(self.run_dir),
            "name": self.run_dir.name,
            "steps": steps,
            "evals": evals,
            "statuses": statuses,
            "traces": list_traces(self.run_dir),
            "finished": (self.run_dir / "report.html").exists(),
            "updated": stamp,
        }

    def step(self, kind: str, step: int) -> dict[str, Any]:
        """The rollouts of one stored step, in summary (no tokens, no conversation)."""
        traces = self._load(kind, step)
        out = []
        for r in traces.rollouts:
            rows = r.get("rows", [])
            tokens = sum(len(x["token_ids"]) + (x["base"][1] if x.get("base") else 0) for x in rows)
            trained = sum(e - s for x in rows for s, e in x["mask"])
            versions = sorted({v for x in rows for t in x["turns"] for v in _stored_versions(t)})
            interrupted = sum(1 for x in rows for t in x["turns"] if len(_stored_versions(t)) > 1)
            turns = sum(1 for n in r.get("conversation", []) if n.get("turn") is not None)
            error = r.get("error") or ""
            out.append(
                {
                    "rollout_id": r["rollout_id"],
                    "group_id": r["group_id"],
                    "payload": r.get("payload"),
                    "status": r["status"],
                    "reward": r.get("reward"),
                    "advantage": r.get("advantage"),
                    "elapsed_s": r.get("elapsed_s"),
                    "turns": turns or int((r.get("faults") or {}).get("model_turns", 0)),
                    "rows": len(rows),
                    "tokens": tokens,
                    "trained": trained,
                    "weight_versions": versions,
                    "interrupted_turns": interrupted,
                    "truncated": any(bool((x.get("metadata") or {}).get("truncated")) for x in rows),
                    "parse": parse_counts(rows),
                    "policies": policy_counts(rows),
                    "error": error.strip().splitlines()[-1][:300] if error.strip() else "",
                }
            )
        return {
            "kind": kind,
            "step": step,
            "partial": traces.partial,
            "weight_version": traces.header.get("weight_version"),
            "rollouts": out,
        }

    def rollout(self, kind: str, step: int, rollout_id: str) -> dict[str, Any]:
        """One rollout in full: its record, and each row's tokens with text, mask and logprob."""
        traces = self._load(kind, step)
        for r in traces.rollouts:
            if r["rollout_id"] == rollout_id:
                break
        else:
            raise KeyError(f"no rollout {rollout_id!r} in the {kind} traces of step {step}")
        texts = traces.header.get("tokens", {})
        rows = []
        for row in rows_of(r):
            rows.append(
                {
                    "row_index": row.row_index,
                    "prompt_length": row.prompt_length,
                    "token_ids": row.token_ids,
                    "texts": [texts.get(str(i), "") for i in row.token_ids],
                    "mask": row.loss_mask,
                    "logprobs": row.logprobs,
                    "turns": [[t.start, t.end, str(t.finish_reason), t.weight_version] for t in row.turns],
                    "segments": [[[g.start, g.end, g.weight_version] for g in t.segments] for t in row.turns],
                    "metadata": row.metadata,
                    "policy": row.policy(),
                    "parse": [_parse_of(t) for t in row.turns],
                }
            )
        full = {k: v for k, v in r.items() if k != "rows"}
        return {"kind": kind, "step": step, **full, "rows": rows}

    def export(self, train_steps: int | None) -> dict[str, Any]:
        """Everything a static page shows: the overview, and every stored eval plus the
        last ``train_steps`` stored training steps (all of them for None) in full."""
        run = self.overview()
        chosen = {"train": run["traces"]["train"], "eval": run["traces"]["eval"]}
        if train_steps is not None:
            chosen["train"] = chosen["train"][-train_steps:] if train_steps > 0 else []
        steps: dict[str, Any] = {}
        rollouts: dict[str, Any] = {}
        for kind, numbers in chosen.items():
            for n in numbers:
                try:  # a file the run removes meanwhile (trainer.keep_traces) is left out
                    summary = self.step(kind, n)
                    full = {r["rollout_id"]: self.rollout(kind, n, r["rollout_id"]) for r in summary["rollouts"]}
                except (KeyError, ValueError):
                    continue
                steps[f"{kind}/{n}"] = summary
                rollouts.update({f"{kind}/{n}/{rid}": r for rid, r in full.items()})
        run["traces"] = {k: sorted(int(key.split("/")[1]) for key in steps if key.startswith(k + "/")) for k in KINDS}
        return {"run": run, "steps": steps, "rollouts": rollouts}

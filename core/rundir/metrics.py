"""Where step metrics go: the console, ``metrics.jsonl``, and wandb/tensorboard when asked.

``metrics.jsonl`` survives crashes and resumes: a torn last line (a run killed
mid-write) is ignored by ``read_metrics`` and cut off when a run reopens the
file, and a resumed run writes a ``{"event": "resume", "step": S}`` marker so
readers drop the records of steps after S that the interrupted run logged
(the resumed run logs them again).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from core.errors import ConfigError


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per step to ``<run_dir>/metrics.jsonl`` and forwards
    to optional loggers."""

    def __init__(self, run_dir: Path, loggers: list[str], *, config: dict[str, Any]) -> None:
        self.path = run_dir / "metrics.jsonl"
        _cut_torn_tail(self.path)
        self._file = self.path.open("a")
        self._wandb: Any = None
        self._tb: Any = None
        for name in loggers:
            if name == "wandb":
                try:
                    import wandb
                except ImportError as exc:
                    raise ConfigError("trainer.loggers has 'wandb' but wandb is not installed") from exc
                self._wandb = wandb.init(config=config, dir=str(run_dir))
            elif name == "tensorboard":
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as exc:
                    raise ConfigError(
                        "trainer.loggers has 'tensorboard' but tensorboard is not installed"
                    ) from exc
                self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            elif name not in ("jsonl", "console"):
                raise ConfigError(
                    f"unknown logger {name!r} in trainer.loggers; use jsonl, console, wandb, tensorboard"
                )

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _finite(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())  # one per step: a crash loses at most the line being written
        step = int(record.get("step", 0))
        numeric = {k: v for k, v in clean.items() if isinstance(v, int | float) and v is not None}
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)

    def mark_resume(self, step: int) -> None:
        """Record that the run resumed at ``step`` (to ``metrics.jsonl`` only)."""
        self._file.write(json.dumps({"event": RESUME_EVENT, "step": int(step)}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


RESUME_EVENT = "resume"


def _cut_torn_tail(path: Path) -> None:
    """Drop an unterminated last line (a write cut short by a crash), so appending
    starts on a fresh line instead of gluing onto the fragment."""
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    with path.open("r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, as the run's final timeline.

    At each resume marker, earlier records of steps after the resume point are
    dropped (the resumed run logged those steps again), so each step appears
    as in one uninterrupted run. A torn last line is ignored.

    Raises:
        ValueError: a line other than the last is not JSON (the file was damaged).
    """
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break  # torn by a crash mid-write
            raise ValueError(f"{path}:{number} is not a JSON record ({exc}); the file is damaged") from exc
        if isinstance(record, dict) and record.get("event") == RESUME_EVENT:
            step = int(record.get("step", 0))
            records = [r for r in records if int(r.get("step", 0)) <= step]
            continue
        records.append(record)
    return records


CONSOLE_LEGEND = (
    "columns: reward = mean of the step's rewards; failed = rollouts left out; lp-gap = largest "
    "trainer-vs-sampler logprob gap of a trained token (about 0 in sync mode; grows with staleness "
    "in async mode); stale = mean/max weight versions behind"
)
"""Printed once above the step lines; docs/quickstart.md ("The console") says more."""


def console_line(record: dict[str, Any]) -> str:
    """One readable line per step."""
    parts = [f"step {record['step']:>4}"]
    for key, fmt in (
        ("reward/mean", "reward {:.3f}"),
        ("eval/reward_mean", "eval {:.3f}"),
        ("rollouts/failed", "failed {}"),
        ("train/logprob_diff_max", "lp-gap {:.1e}"),
        ("time/step", "{:.2f}s"),
    ):
        if record.get(key) is not None:
            parts.append(fmt.format(record[key]))
    if "async/groups" in record:  # trainer.mode=async: how old what trained was
        parts.append(
            f"stale {record.get('async/staleness_mean') or 0.0:.2f}/{record.get('async/staleness_max') or 0}"
        )
        if record.get("async/masked_stale_tokens"):
            parts.append(f"masked {record['async/masked_stale_tokens']}")
    return "  ".join(parts)


def closing_lines(record: dict[str, Any], *, what: str, run_dir: Path, has_eval: bool) -> list[str]:
    """The lines a finished run ends with: what ran, where its run directory is, and what
    to do next (view it, evaluate it).

    Args:
        record: the run's final ``metrics.jsonl`` record (``step``, ``time/train_wall``,
            ``eval/reward_mean`` when it evaluated).
        what: the task and backend, e.g. ``task=succ_digit backend=local``.
        run_dir: the run directory.
        has_eval: the task has an eval set (``python -m core.eval`` needs one).
    """
    summary = f"run finished at step {record['step']} ({what}) in {float(record.get('time/train_wall') or 0.0):.1f}s"
    if record.get("eval/reward_mean") is not None:
        summary += f"; final eval reward {record['eval/reward_mean']:.3f}"
    eval_note = "its last checkpoint on the eval set" if has_eval else "its last checkpoint, given an eval set (task.eval_path)"
    return [
        summary,
        f"run dir: {run_dir} (metrics.jsonl, report.html, traces/, checkpoints/)",
        f"next: python -m core.view {run_dir}    # what the agents did, token by token (docs/viewer.md)",
        f"next: python -m core.eval eval.checkpoint={run_dir}    # {eval_note} (docs/eval.md)",
    ]

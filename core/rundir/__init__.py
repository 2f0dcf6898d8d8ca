"""The run directory's formats: what a run writes and what the viewer, eval and report read.

Modules (each owns one part of ``<run_dir>``):

- ``traces``: ``traces/`` (each stored step's rollouts; ``TraceWriter``, ``read_traces``);
- ``metrics``: ``metrics.jsonl`` (``MetricsWriter``, ``read_metrics``, ``console_line``);
- ``checkpoint``: ``checkpoints/`` and the run-directory lock (``latest_checkpoint``,
  ``RunDirLock``);
- ``report``: ``report.html`` (``write_report``).

Nothing here imports the trainer, so the viewer and eval read a run without it.
"""

from __future__ import annotations

from core.rundir.checkpoint import (
    STATE_FILE,
    Checkpoint,
    RunDirLock,
    checkpoint_dir,
    latest_checkpoint,
)
from core.rundir.metrics import MetricsWriter, console_line, read_metrics
from core.rundir.report import write_report
from core.rundir.traces import TraceWriter, list_traces, read_traces, rows_of, trace_path

__all__ = [
    "STATE_FILE",
    "Checkpoint",
    "MetricsWriter",
    "RunDirLock",
    "TraceWriter",
    "checkpoint_dir",
    "console_line",
    "latest_checkpoint",
    "list_traces",
    "read_metrics",
    "read_traces",
    "rows_of",
    "trace_path",
    "write_report",
]

"""The run directory's formats: what a run writes and what the viewer, eval and report read.

Modules (each owns one part of ``<run_dir>``):

- ``traces``: ``traces/`` (each stored step's rollouts; ``TraceWriter``, ``read_traces``);
- ``metrics``: ``metrics.jsonl`` (``MetricsWriter``, ``read_metrics``, ``console_line``);
- ``checkpoint``: ``checkpoints/`` and the run-directory lock (``latest_checkpoint``,
  ``prune_checkpoints``, ``RunDirLock``);
- ``runconfig``: ``tracerl_run.yaml``, how the run was started (``read_run_record``),
  which resume, eval and export reuse;
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
    prune_checkpoints,
)
from core.rundir.metrics import MetricsWriter, console_line, read_metrics
from core.rundir.report import write_report
from core.rundir.runconfig import RUN_FILE, RunRecord, read_run_record, run_dir_of
from core.rundir.traces import TraceWriter, list_traces, read_traces, rows_of, trace_path

__all__ = [
    "RUN_FILE",
    "STATE_FILE",
    "Checkpoint",
    "MetricsWriter",
    "RunDirLock",
    "RunRecord",
    "TraceWriter",
    "checkpoint_dir",
    "console_line",
    "latest_checkpoint",
    "list_traces",
    "prune_checkpoints",
    "read_metrics",
    "read_run_record",
    "read_traces",
    "rows_of",
    "run_dir_of",
    "trace_path",
    "write_report",
]

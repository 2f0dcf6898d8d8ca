"""Checkpoints: the backend's state plus the loop's own (step, data order).

Layout: ``<run_dir>/checkpoints/step_000010/{backend/, trainer_state.json}``.
``trainer_state.json`` is written last (fsynced, then renamed into place), so a
directory without it (a run killed mid-save) is ignored on resume; one whose
state cannot be read is skipped for the previous complete checkpoint.
``RunDirLock`` keeps two runs out of one ``run_dir``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError

STATE_FILE = "trainer_state.json"
LOCK_FILE = ".tracerl.lock"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    step: int
    """Steps completed when it was written."""
    path: Path
    """Its directory."""
    state: dict[str, Any]
    """The loop's state (``step``, ``data``, ``backend_path``)."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def _fsync_dir(path: Path) -> None:
    """Persist a directory entry (a rename) where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)


def write_trainer_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``trainer_state.json`` atomically and durably: the data reaches the disk
    before the rename that makes the checkpoint count, and the rename itself is synced."""
    tmp = path / (STATE_FILE + ".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(state, indent=2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / STATE_FILE)
    _fsync_dir(path)


def existing_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories that hold a state file, by name (= by step)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(c for c in root.iterdir() if (c / STATE_FILE).is_file())


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((path / STATE_FILE).read_text())
        int(state["step"])
        state["data"], state["backend_path"]  # noqa: B018 (both needed on resume)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"warning: checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); "
            "falling back to an earlier one",
            file=sys.stderr,
        )
        return None
    return state if isinstance(state, dict) else None


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The readable complete checkpoint with the highest step, or None.

    A newest checkpoint whose state file is torn or malformed (a crash or a full
    disk while saving) is skipped with a warning for the one before it.
    """
    found: list[tuple[int, Path, dict[str, Any]]] = []
    for child in existing_checkpoints(run_dir):
        state = _read_state(child)
        if state is not None:
            found.append((int(state["step"]), child, state))
    if not found:
        return None
    step, path, state = max(found, key=lambda item: item[0])
    return Checkpoint(step=step, path=path, state=state)


class RunDirLock:
    """An exclusive lock on ``<run_dir>/.tracerl.lock`` for the life of a run.

    Two runs writing one ``run_dir`` would interleave their metrics and overwrite
    each other's checkpoints. The lock is an ``flock``, so the kernel releases it
    when the process dies: a killed run never leaves a stale lock behind.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._file: Any = self.path.open("a+")
        try:
            import fcntl
        except ImportError:  # no flock on this platform: run without the guard
            return
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise ConfigError(
                f"run_dir {run_dir} is in use by another training run ({holder}); wait for it "
                "to finish or choose another run_dir"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        """Unlock (closing the file drops the flock)."""
        if not self._file.closed:
            self._file.close()

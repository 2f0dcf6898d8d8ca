"""Checkpoints: the backend's state plus the loop's own (step, data order).

Layout: ``<run_dir>/checkpoints/step_000010/{backend/, trainer_state.json}``.
``trainer_state.json`` is written last (fsynced, then renamed into place), so a
directory without it (a run killed mid-save) is ignored on resume; one whose
state cannot be read is skipped for the previous complete checkpoint. The state
records the size of every file the backend wrote into a local ``backend_path``
(fsynced first); a checkpoint whose backend files are missing, empty or of
another size (a torn ``state.pt``) is skipped the same way.
``RunDirLock`` keeps two runs out of one ``run_dir``; ``prune_checkpoints`` keeps
the newest few (and one chosen step, the best by eval) and deletes the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError

STATE_FILE = "trainer_state.json"
LOCK_FILE = ".tracerl.lock"
BACKEND_FILES = "backend_files"
"""Key of ``trainer_state.json`` holding ``{relative path: size}`` of the backend's files."""


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


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local_backend_dir(state: dict[str, Any]) -> Path | None:
    """``backend_path`` when it is a directory here (a remote backend's is a URI)."""
    where = state.get("backend_path")
    if not isinstance(where, str) or not where or "://" in where:
        return None
    path = Path(where)
    return path if path.is_dir() else None


def _sync_backend_files(backend: Path) -> dict[str, int]:
    """Fsync every file the backend wrote and return their sizes by relative path."""
    sizes: dict[str, int] = {}
    for file in sorted(backend.rglob("*")):
        if file.is_file() and not file.is_symlink():
            _fsync_file(file)
            sizes[file.relative_to(backend).as_posix()] = file.stat().st_size
    for folder in {f.parent for f in backend.rglob("*") if f.is_file()} | {backend}:
        _fsync_dir(folder)
    return sizes


def write_trainer_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``trainer_state.json`` atomically and durably: the data reaches the disk
    before the rename that makes the checkpoint count, and the rename itself is synced.

    A local backend directory's files are fsynced first and their sizes recorded, so a
    resume can tell a complete ``state.pt`` from an empty or torn one.
    """
    backend = _local_backend_dir(state)
    if backend is not None:
        state = {**state, BACKEND_FILES: _sync_backend_files(backend)}
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


def _backend_problem(state: dict[str, Any]) -> str | None:
    """Why the backend's files of a checkpoint cannot be loaded, or None.

    Checked against the sizes recorded when it was written; a checkpoint written
    before sizes were recorded is checked for empty files only.
    """
    recorded = state.get(BACKEND_FILES)
    where = state.get("backend_path")
    if isinstance(recorded, dict):
        root = Path(str(where))
        for name, size in recorded.items():
            file = root / str(name)
            try:
                actual = file.stat().st_size
            except OSError:
                return f"backend file {file} is missing"
            if actual != size:
                return f"backend file {file} has {actual} bytes, {size} were written"
        return None
    backend = _local_backend_dir(state)
    if backend is not None:
        for file in sorted(backend.rglob("*")):
            if file.is_file() and file.stat().st_size == 0:
                return f"backend file {file} is empty"
    return None


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
    if not isinstance(state, dict):
        return None
    problem = _backend_problem(state)
    if problem is not None:
        print(
            f"warning: skipping checkpoint {path}: {problem} (torn or unfinished save); "
            "falling back to an earlier one",
            file=sys.stderr,
        )
        return None
    return state


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The readable complete checkpoint with the highest step, or None.

    A newest checkpoint whose state file is torn or malformed, or whose backend
    files are missing, empty or cut short (a crash or a full disk while saving),
    is skipped with a warning naming it, for the one before it.
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


def prune_checkpoints(run_dir: Path, *, keep_last: int, keep_steps: set[int] | frozenset[int] = frozenset()) -> list[Path]:
    """Delete complete checkpoints but the newest ``keep_last`` and those of ``keep_steps``.

    ``keep_last`` 0 keeps all. Directories without a state file (a save under way, or one
    a crash cut short) are left alone. Returns the deleted directories.
    """
    if keep_last <= 0:
        return []
    found = existing_checkpoints(run_dir)
    deleted = []
    for path in found[: max(0, len(found) - keep_last)]:
        try:
            step = int(json.loads((path / STATE_FILE).read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: not ours to judge; latest_checkpoint skips it anyway
        if step in keep_steps:
            continue
        # The state file goes first: a deletion cut short leaves an incomplete
        # checkpoint that resume ignores, never a complete-looking torn one.
        (path / STATE_FILE).unlink()
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted


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

"""Checkpoints: the backend's state plus the loop's own (step, data order).

Layout: ``<run_dir>/checkpoints/step_000010/{backend/, trainer_state.json}``.
``trainer_state.json`` is written last, so a directory without it (a run
killed mid-save) is ignored on resume.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"


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


def write_trainer_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path / STATE_FILE)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The complete checkpoint with the highest step, or None."""
    root = run_dir / "checkpoints"
    best: Checkpoint | None = None
    if not root.is_dir():
        return None
    for child in root.iterdir():
        state_file = child / STATE_FILE
        if not state_file.is_file():
            continue
        state = json.loads(state_file.read_text())
        if best is None or state["step"] > best.step:
            best = Checkpoint(step=int(state["step"]), path=child, state=state)
    return best

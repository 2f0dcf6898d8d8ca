"""scripts/setup.sh refuses what it cannot use with a message saying what to do, before it
installs anything (README's commands start with it on a machine we have not seen)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setup(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False,
    )


def test_an_unknown_argument_shows_the_usage() -> None:
    proc = _setup("tests", env={})
    assert proc.returncode == 2 and "usage: bash scripts/setup.sh [test]" in proc.stderr


def test_a_python_older_than_3_11_is_refused_by_name(tmp_path: Path) -> None:
    """A stand-in interpreter that reports 3.10 (no old Python need be installed here)."""
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\ncase "$2" in *platform*) echo 3.10.14;; esac\nexit 1\n')
    old.chmod(old.stat().st_mode | stat.S_IEXEC)
    proc = _setup(env={"TRACERL_PYTHON": str(old)})
    assert proc.returncode == 1
    assert f"needs Python 3.11 or newer; '{old}' is 3.10.14" in proc.stderr
    assert "TRACERL_PYTHON" in proc.stderr


def test_a_missing_python_is_named() -> None:
    proc = _setup(env={"TRACERL_PYTHON": "no-such-python3"})
    assert proc.returncode == 1 and "no 'no-such-python3' on PATH" in proc.stderr


def test_an_unknown_torch_build_lists_the_choices() -> None:
    """From inside a virtual environment (this test's), so no .venv is made first."""
    assert sys.prefix != sys.base_prefix
    proc = _setup(env={"TRACERL_PYTHON": sys.executable, "TRACERL_TORCH": "rocm"})
    assert proc.returncode == 2 and "TRACERL_TORCH=rocm; use cpu (the default), cuda or skip" in proc.stderr

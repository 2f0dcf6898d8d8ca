"""README's two commands, as a new user runs them: in a fresh copy of this checkout, from a
shell with no virtual environment active, so ``scripts/setup.sh`` must make ``.venv`` itself
and install everything from the package registries (the system Python of Debian 12 or Ubuntu
24.04 refuses ``pip install``: externally-managed-environment).

Marker ``long``: two installs into a new virtual environment take minutes
(docs/performance.md#fresh-install). CI's ``.ci/run`` runs README's test command as written on
its own clean checkout as well.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESOLVER_ERROR = "ERROR: pip's dependency resolver"


def _readme_command(start: str) -> str:
    """The README console line that starts with ``start``."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", readme, re.DOTALL)
    (line,) = [ln for block in blocks for ln in block.splitlines() if ln.startswith(start)]
    return line


def _fresh_copy(dest: Path) -> Path:
    """This checkout's files as git sees them (tracked and new, nothing ignored: no .venv)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
    return dest


def _user_shell_env() -> dict[str, str]:
    """The environment of a shell where no virtual environment is active: this test's own
    venv (and any PYTHONPATH pointing at a checkout) is taken away, the base interpreter's
    ``python3`` comes first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"}}
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env["PATH"] = os.pathsep.join([str(Path(sys.base_prefix) / "bin"), *path])
    return env


def _bash(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=2400, check=False
    )


@pytest.mark.long
@pytest.mark.timeout(5400)
def test_readme_commands_work_in_a_fresh_checkout(tmp_path: Path) -> None:
    train = _readme_command("bash scripts/setup.sh && ")
    test = _readme_command("bash scripts/setup.sh test && ")
    assert train.endswith("python -m core.train") and test.endswith("python -m pytest -n auto --dist loadfile")
    assert sys.prefix != sys.base_prefix, "run from a virtual environment, so that this test can leave it"
    repo = _fresh_copy(tmp_path / "tracerl")
    env = _user_shell_env()
    assert not (repo / ".venv").exists()

    # The first command as written; the run is cut to 2 steps (the default task's 400-step
    # learning run is tests/learning's).
    proc = _bash(f"{train} trainer.max_steps=2 trainer.progress=false", repo, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert (repo / ".venv" / "pyvenv.cfg").is_file()  # setup.sh made it
    assert "run finished at step 2 (task=succ_digit backend=local)" in proc.stdout, out[-3000:]
    assert re.search(r"^next: python -m core\.view outputs/\S+", proc.stdout, re.MULTILINE), proc.stdout
    assert RESOLVER_ERROR not in out
    torch = subprocess.run(
        [str(repo / ".venv/bin/python"), "-c", "import torch; print(torch.version.cuda)"],
        capture_output=True, text=True, check=True, env=env,
    )
    assert torch.stdout.strip() == "None", "the default torch is the CPU build"

    # The second command after the first (the order README gives): the test extras install
    # without pip's resolver error block, and pytest runs (here one file; CI runs the suite).
    proc = _bash(f"{test} tests/meta/test_docs.py -q -p no:cacheprovider", repo, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert RESOLVER_ERROR not in out, out[-5000:]
    assert re.search(r"^\d+ passed", proc.stdout.strip().splitlines()[-1]), proc.stdout[-2000:]

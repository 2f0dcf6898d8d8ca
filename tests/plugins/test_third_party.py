"""A third-party backend distribution, pip-installed into a throwaway virtual
environment, is found by ``python -m core.train`` and ``python -m core.plugins``.

The venv sees the test environment's packages (``--system-site-packages``),
so tracerl itself is not reinstalled and the test environment is left untouched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent.parent / "fixtures" / "echo_backend"


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("thirdparty")
    src = root / "src"
    shutil.copytree(FIXTURE, src)
    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return python


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.integration
def test_plugins_listing_shows_third_party_distribution(venv_python: Path, tmp_path: Path) -> None:
    proc = _run(venv_python, "-m", "core.plugins", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("echo"))
    assert "tracerl-echo 0.0.7" in line
    assert "[driving]" in line


@pytest.mark.integration
def test_train_finds_third_party_backend_and_its_config(venv_python: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _run(
        venv_python,
        "-m",
        "core.train",
        "backend=echo",
        "backend.greeting=bonjour",
        "trainer.max_steps=7",
        f"run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "echo backend: bonjour" in proc.stdout
    assert json.loads((run_dir / "echo.json").read_text()) == {
        "greeting": "bonjour",
        "max_steps": 7,
        "seed": 0,
    }


@pytest.mark.integration
def test_third_party_config_is_type_checked(venv_python: Path, tmp_path: Path) -> None:
    proc = _run(
        venv_python,
        "-m",
        "core.train",
        "backend=echo",
        "backend.exit_code=not-a-number",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "exit_code" in proc.stderr


@pytest.mark.integration
def test_exit_code_of_driving_backend_is_propagated(venv_python: Path, tmp_path: Path) -> None:
    proc = _run(
        venv_python,
        "-m",
        "core.train",
        "backend=echo",
        "backend.exit_code=3",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stderr

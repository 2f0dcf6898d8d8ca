"""A third-party backend distribution, pip-installed into a throwaway virtual
environment, is found by ``python -m core.train`` and ``python -m core.plugins``.

The throwaway venv sees the *running* interpreter's packages through a
``.pth`` file that calls ``site.addsitedir`` on each of its site-packages
directories (so editable installs' own ``.pth`` hooks run too). That works
whether the tests run in a virtual environment, as the README suggests, or
in a system Python; ``--system-site-packages`` would only reach the base
interpreter's packages, not an active venv's. tracerl itself is not
reinstalled and the test environment is left untouched. The fixture is built
without build isolation (no download) by the running environment's
setuptools, which ``pip install -e .[test]`` pins to a version that builds
wheels on its own.
"""

from __future__ import annotations

import json
import shutil
import site
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
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    share_site_packages(python)
    proc = subprocess.run(
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
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"pip could not install the fixture backend:\n{proc.stderr}"
    return python


def share_site_packages(python: Path) -> Path:
    """Make the venv of ``python`` import what the running interpreter imports.

    A ``.pth`` line starting with ``import`` is executed at start-up; ``addsitedir``
    (unlike a plain path line) also processes that directory's own ``.pth`` files,
    which is how editable installs (tracerl, the in-tree plugins) are found.
    """
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    if site.ENABLE_USER_SITE and Path(site.getusersitepackages()).is_dir():
        dirs.append(site.getusersitepackages())
    pth = Path(target) / "_tracerl_test_parent_env.pth"
    # One line, no comprehension: site exec()s it where a comprehension cannot see `site`.
    pth.write_text(f"import site; list(map(site.addsitedir, {dirs!r}))\n")
    return pth


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

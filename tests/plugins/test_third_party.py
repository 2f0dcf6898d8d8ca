"""Third-party plugin distributions, pip-installed into one throwaway virtual
environment, are found by ``python -m core.train`` and ``python -m core.plugins``;
the broken ones (``tests/fixtures/faulty_plugins``) are named in every message
about them, and every command that does not need them still runs.

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
import os
import re
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from core.plugins.scaffold import scaffold

FIXTURES = Path(__file__).parent.parent / "fixtures"
DISTRIBUTIONS = {
    "echo": FIXTURES / "echo_backend",
    "faulty": FIXTURES / "faulty_plugins",
}
BROKEN = "plugin 'broken' (entry point broken = tracerl_faulty.broken, distribution tracerl-faulty 0.2.0)"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("thirdparty")
    sources = []
    for name, fixture in DISTRIBUTIONS.items():  # copied: building writes into the source tree
        shutil.copytree(fixture, root / name)
        sources.append(str(root / name))
    # a runtime plugin as `python -m core.plugins new pooled` writes it
    sources.append(str(scaffold("pooled", root, kind="runtime")))
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
            *sources,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"pip could not install the fixture plugins:\n{proc.stderr}"
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


def _run(
    python: Path, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("TRACERL_DEBUG", "HYDRA_FULL_ERROR")}
    return subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        # this checkout's core, not whichever tracerl the environment has installed
        env={**environ, "PYTHONPATH": os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")]),
             **(env or {})},
    )


@pytest.mark.integration
def test_plugins_listing_shows_third_party_distribution(venv_python: Path, tmp_path: Path) -> None:
    proc = _run(venv_python, "-m", "core.plugins", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("echo"))
    assert "tracerl-echo 0.0.7" in line
    assert "[driving]" in line
    pooled = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("pooled"))
    assert "tracerl-pooled 0.1.0" in pooled
    # the broken plugins beside them are named, and the rest is still listed
    out = proc.stdout
    assert f"{BROKEN} failed to import: ModuleNotFoundError: No module named 'tracerl_missing_sdk'" in out
    assert "tracerl_faulty/broken.py:5" in out  # the file and line that failed
    assert "Traceback" not in out and "TRACERL_DEBUG=1 shows tracebacks" in out
    misnamed = next(ln for ln in out.splitlines() if ln.strip().startswith("misnamed"))
    assert "BROKEN" in misnamed and "config whose name is 'misnamd'" in misnamed
    assert "entry point misnamed = tracerl_faulty.misnamed" in misnamed
    assert "TRACERL_DISABLE_PLUGINS=misnamed silences it" in misnamed
    twin = next(ln for ln in out.splitlines() if ln.strip().startswith("twin"))
    assert "twin_a = tracerl_faulty.twin_a" in twin and "twin_b = tracerl_faulty.twin_b" in twin
    assert "TRACERL_DISABLE_PLUGINS=twin_b" in twin
    assert re.search(r"^\s+local\s+\[driven\]\s+tracerl-local", out, re.M)


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
    # the broken plugins installed beside it cost a warning, not the run
    assert f"warning: {BROKEN} failed to import" in proc.stderr
    assert json.loads((run_dir / "echo.json").read_text()) == {
        "greeting": "bonjour",
        "max_steps": 7,
        "seed": 0,
    }


_SCORE_WITH_LOUD = """
import asyncio, json
from core.plugins import load_plugins
from core.rewards import build_reward_stage
from core.testing import compose_config
from core.rollout import RolloutOutcome
from core.types import RolloutRequest, RolloutResult, RolloutStatus

plugins = load_plugins()
stage = build_reward_stage(compose_config(["reward=loud", "reward.per_bang=2", "reward.mode=add"], plugins), plugins)
said = [{"parent": -1, "turn": 0, "messages": [{"role": "assistant", "content": "yes!!!"}]}]
outcome = RolloutOutcome(
    request=RolloutRequest("r1", "g", {}, "http://x/v1", "s", "m"),
    result=RolloutResult("r1", RolloutStatus.OK, reward=1.0),
    rows=[],
    conversation=said,
)
(scored,) = asyncio.run(stage.score([outcome]))
print(json.dumps({"reward": scored.result.reward, "metrics": scored.result.metrics}))
"""


@pytest.mark.integration
def test_third_party_reward_plugin_is_listed_and_scores(venv_python: Path, tmp_path: Path) -> None:
    """``reward=loud`` from the installed tracerl-echo distribution: listed with its
    distribution, composed from its own config node, and its factory scores a rollout."""
    listing = _run(venv_python, "-m", "core.plugins", cwd=tmp_path)
    loud = next(ln for ln in listing.stdout.splitlines() if ln.strip().startswith("loud"))
    assert "tracerl-echo 0.0.7" in loud and "exclamation marks" in loud
    proc = _run(venv_python, "-c", _SCORE_WITH_LOUD, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"reward": 7.0, "metrics": {"reward/loud": 6.0}}  # agent's 1.0 + 3 bangs * 2


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


@pytest.mark.integration
def test_check_exits_nonzero_naming_each_broken_plugin(venv_python: Path, tmp_path: Path) -> None:
    proc = _run(venv_python, "-m", "core.plugins", "--check", cwd=tmp_path)
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 3, proc.stderr
    assert any(BROKEN in e for e in errors)
    assert any("backend 'misnamed'" in e and "tracerl-faulty 0.2.0" in e for e in errors)
    assert any("backend 'twin' is registered by" in e for e in errors)
    assert "in plugin(s) broken, misnamed, twin_b" in proc.stderr


@pytest.mark.integration
def test_check_passes_once_the_broken_ones_are_blocked(venv_python: Path, tmp_path: Path) -> None:
    """Blocking what the messages say to block is enough: blocking twin_b leaves twin_a's
    backend valid (no duplicate any more)."""
    proc = _run(
        venv_python, "-m", "core.plugins", "--check", cwd=tmp_path,
        env={"TRACERL_DISABLE_PLUGINS": "broken,misnamed,twin_b"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "not checked (blocked by TRACERL_DISABLE_PLUGINS): broken, misnamed, twin_b" in proc.stdout


@pytest.mark.integration
def test_help_runs_with_a_warning_naming_the_broken_plugin(venv_python: Path, tmp_path: Path) -> None:
    proc = _run(venv_python, "-m", "core.train", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "== Configuration groups ==" in proc.stdout
    assert f"warning: {BROKEN} failed to import" in proc.stderr
    assert "Set TRACERL_DEBUG=1 for the traceback." in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_run_selecting_the_broken_backend_fails_naming_it(venv_python: Path, tmp_path: Path) -> None:
    """With TRACERL_DEBUG=1 the traceback follows the message (without it, none: see the
    help test above and test_registry's in-process checks)."""
    proc = _run(
        venv_python, "-m", "core.train", "backend=broken", cwd=tmp_path, env={"TRACERL_DEBUG": "1"}
    )
    assert proc.returncode == 2
    error = next(ln for ln in proc.stderr.splitlines() if ln.startswith("error: "))
    assert f"backend 'broken' is unavailable: {BROKEN} failed to import: ModuleNotFoundError" in error
    assert "Traceback (most recent call last)" in proc.stderr
    assert "import tracerl_missing_sdk" in proc.stderr


@pytest.mark.integration
def test_blocked_backend_says_blocked_and_bad_block_names_warn(
    venv_python: Path, tmp_path: Path
) -> None:
    env = {"TRACERL_DISABLE_PLUGINS": "echo,tracerl_faulty.misnamed"}
    listing = _run(venv_python, "-m", "core.plugins", cwd=tmp_path, env=env)
    assert listing.returncode == 0, listing.stderr
    blocked = listing.stdout.split("blocked by TRACERL_DISABLE_PLUGINS:")[1]
    assert "plugin 'echo' (entry point echo = tracerl_echo.plugin, distribution tracerl-echo 0.0.7)" in blocked
    assert (
        "warning: TRACERL_DISABLE_PLUGINS: 'tracerl_faulty.misnamed' matches no plugin, so it blocks "
        "nothing; it looks like the distribution or module of plugin 'misnamed': use "
        "TRACERL_DISABLE_PLUGINS=misnamed"
    ) in listing.stderr
    run = _run(venv_python, "-m", "core.train", "backend=echo", cwd=tmp_path, env=env)
    assert run.returncode == 2
    assert "error: backend 'echo' is blocked: TRACERL_DISABLE_PLUGINS blocks plugin 'echo'" in run.stderr
    assert "pip install" not in run.stderr


@pytest.mark.integration
def test_scaffolded_runtime_plugin_installs_and_passes_the_runtime_conformance_suite(
    venv_python: Path,
) -> None:
    """The distribution `new` writes installs, is found, and its own conformance test runs
    from its own folder. One test of the suite runs here (one runtime start): the pooled
    runtime delegates to LocalRuntime, which tests/runtime/local/test_local_runtime_conformance.py
    runs through the whole suite."""
    dist = venv_python.parents[2] / "tracerl-pooled"
    proc = _run(
        venv_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "faults_are_results",
        cwd=dist, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # it needs no pytest plugin
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 3 deselected" in proc.stdout

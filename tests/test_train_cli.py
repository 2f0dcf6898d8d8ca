"""``python -m core.train``: composition, overrides and the errors users hit first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.entry import requested_choices


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.train", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_unknown_backend_exits_nonzero_naming_installed(tmp_path: Path) -> None:
    proc = _train("backend=nosuch", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown backend 'nosuch'" in proc.stderr
    assert re.search(r"Installed backends: [a-z, ]*\blocal\b", proc.stderr)
    assert "Traceback" not in proc.stderr


def test_in_tree_backend_not_installed_says_which_install(tmp_path: Path) -> None:
    from core.plugins import IN_TREE_BACKENDS, load_plugins

    installed = load_plugins().backends
    # tracerl-verl lives in its own venv (it pins transformers), so the test env lacks it
    missing = [name for name in IN_TREE_BACKENDS if name not in installed]
    assert missing, "every in-tree backend is installed here; nothing to check"
    proc = _train(f"backend={missing[0]}", cwd=tmp_path)
    assert proc.returncode == 2
    if missing[0] == "verl":  # its own environment, never pip-installed here
        assert "bash plugins/verl/scripts/setup_venv.sh" in proc.stderr
        assert "pip install -e plugins/verl" not in proc.stderr
    else:
        assert f"pip install -e plugins/{missing[0]}" in proc.stderr


def test_cfg_job_prints_composed_config_with_overrides(tmp_path: Path) -> None:
    proc = _train(
        "--cfg", "job", "seed=7", "trainer.max_steps=3", "algorithm.learning_rate=0.01", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["seed"] == 7
    assert cfg["trainer"]["max_steps"] == 3
    assert cfg["algorithm"]["learning_rate"] == 0.01
    assert cfg["backend"]["name"] == "local"
    assert cfg["runtime"]["name"] == "local"
    assert cfg["run_dir"].startswith("outputs/")
    assert not (tmp_path / "outputs").exists()  # --cfg only prints


def test_type_errors_in_overrides_are_reported(tmp_path: Path) -> None:
    proc = _train("--cfg", "job", "trainer.max_steps=lots", cwd=tmp_path)
    assert proc.returncode != 0
    assert "max_steps" in proc.stderr


def test_requested_choices_reads_overrides_and_defaults() -> None:
    assert requested_choices([]) == {"backend": "local", "runtime": "local", "reward": "agent"}
    assert requested_choices(["reward=judge"])["reward"] == "judge"
    assert requested_choices(["backend=verl", "seed=1"])["backend"] == "verl"
    assert requested_choices(["runtime=agentcore"])["runtime"] == "agentcore"


def test_the_shared_entry_does_not_import_a_command() -> None:
    """``core.entry`` serves ``core.train`` and ``core.eval``; importing either back (even lazily)
    makes the two modules depend on each other."""
    import ast

    import core.entry

    tree = ast.parse(Path(core.entry.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"core.train", "core.eval", "core.eval.__main__"}, imported


@pytest.mark.parametrize("group", ["algorithm", "task"])
def test_every_yaml_option_of_a_group_composes(group: str, tmp_path: Path) -> None:
    conf = Path(__file__).parent.parent / "core" / "conf" / group
    options = sorted(p.stem for p in conf.glob("*.yaml"))
    # all at once: independent processes, mostly imports, so a second core is not left idle
    procs = {
        option: subprocess.Popen([sys.executable, "-m", "core.train", "--cfg", "job", f"{group}={option}"],
                                 cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for option in options
    }
    try:
        for option, proc in procs.items():
            _, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, (option, stderr)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_both_commands_name_their_hydra_job_after_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    """``core.train`` and ``core.eval`` share one Hydra entry (``core.entry.run_hydra``);
    each job keeps its own name (the run directory's ``<name>.log``). In-process: cheap."""
    from core.eval.__main__ import main as eval_main
    from core.train import main as train_main

    for main, name in ((train_main, "train"), (eval_main, "eval")):
        assert main(["--cfg", "hydra"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["hydra"]["job"]["name"] == name
    assert eval_main(["reward=nope"]) == 2
    assert "unknown reward 'nope'" in capsys.readouterr().err


def test_an_in_process_run_closes_its_job_log(tmp_path: Path) -> None:
    """Hydra opens ``<run_dir>/train.log`` and never closes it; ``run_hydra`` does, so a second
    in-process run (a test, a notebook) does not drop an open file (a ResourceWarning, an error
    under this suite's filterwarnings)."""
    import logging

    from core.config import PRIMARY_CONFIG
    from core.entry import run_hydra

    def body(cfg: object) -> int:
        logging.getLogger("core.test").info("hello from the job")
        return 3

    assert run_hydra(PRIMARY_CONFIG, [f"run_dir={tmp_path}"], body, module="core.train") == 3
    assert "hello from the job" in (tmp_path / "train.log").read_text()
    assert not [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]

"""benchmarks/figures.py: every quoted figure has a command, and the pages say where it comes from."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "figures.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tracerl_figures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_page_quoting_a_figure_names_the_script() -> None:
    figures = _module().FIGURES
    assert {f.name for f in figures} >= {"default_run", "local_runtime", "ray_runtime", "gateway_append", "seeds",
                                        "traces", "stored_response_memory", "frameworks_tests"}
    for figure in figures:
        for page in figure.quoted_in:
            text = (ROOT / page).read_text()
            assert "benchmarks/figures.py" in text, (figure.name, page)


def test_list_and_a_cheap_figure_with_the_machine(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    listing = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, env=env, check=True
    ).stdout
    for figure in _module().FIGURES:
        assert figure.name in listing and figure.command in listing
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "openai_client", "--json", str(out), "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    machine = report["machine"]
    assert machine["cores_usable"] >= 1 and machine["cpu"] and len(machine["load_average_1_5_15"]) == 3
    values = report["figures"]["openai_client"]["values"]
    # the figure the docs quote: a fresh client per call costs far more than a per-session view
    assert values["new_client_cpu_ms"] > 20 * values["with_options_cpu_us"] / 1000
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "nosuch"], capture_output=True, text=True, env=env, check=False
    )
    assert bad.returncode == 2 and "unknown figure" in bad.stderr

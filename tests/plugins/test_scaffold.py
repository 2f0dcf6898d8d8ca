"""``python -m core.plugins new NAME`` writes a distribution whose plugin registers cleanly.

The runtime kind is installed and runs its conformance test in the throwaway venv
(tests/plugins/test_third_party.py); here both kinds are loaded in process.
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

from core.plugins import load_plugins
from core.plugins.__main__ import main


@pytest.mark.parametrize(("kind", "name"), [("runtime", "my-pool"), ("backend", "mybe")])
def test_scaffold_registers_cleanly(
    kind: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["new", name, "--kind", kind, "--dest", str(tmp_path)]) == 0
    root = tmp_path / f"tracerl-{name}"
    package = "tracerl_" + name.replace("-", "_")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["version"] == "0.1.0"
    assert project["entry-points"]["tracerl"] == {name: f"{package}.plugin"}
    assert (root / "tests" / f"test_{package}_conformance.py").is_file()
    monkeypatch.syspath_prepend(str(root))
    plugin = importlib.import_module(f"{package}.plugin")
    try:
        plugins = load_plugins(extra_plugins=(plugin,))
        assert plugins.problems == []
        registry = plugins.runtimes if kind == "runtime" else plugins.backends
        assert name in registry
        node = registry.node(name)
        assert ("pool" if kind == "runtime" else "local") in node
    finally:
        for mod in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[mod]


def test_scaffold_refuses_a_bad_name_and_an_existing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new", "Bad Name", "--dest", str(tmp_path)]) == 2
    assert "plugin name 'Bad Name'" in capsys.readouterr().err
    assert main(["new", "twice", "--dest", str(tmp_path)]) == 0
    assert main(["new", "twice", "--dest", str(tmp_path)]) == 2
    assert "exists already" in capsys.readouterr().err

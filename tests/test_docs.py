"""Docs stay true: every hook is documented, README's commands are what CI runs."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from core.plugins import hookspecs

ROOT = Path(__file__).parent.parent


def _hook_names() -> list[str]:
    return [
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("tracerl_")
    ]


def test_every_hook_has_a_docstring_saying_when_it_is_called() -> None:
    for name in _hook_names():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Called" in doc and ":param" in doc and "versionadded" in doc, name


def test_every_hook_is_documented_for_plugin_authors() -> None:
    text = (ROOT / "docs" / "plugins.md").read_text()
    for name in _hook_names():
        assert re.search(rf"^### `{name}\(", text, re.MULTILINE), name


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "bash scripts/setup.sh test && python -m pytest"
    assert command in readme
    lines = ci.splitlines()
    assert lines.index("bash scripts/setup.sh test") < lines.index("python -m pytest")
    verl = "bash plugins/verl/scripts/run_tests.sh -q"
    assert verl in readme and verl in ci


def test_readme_main_command() -> None:
    assert "bash scripts/setup.sh && python -m core.train" in (ROOT / "README.md").read_text()

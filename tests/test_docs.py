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
    lines = [ln.strip() for ln in ci.splitlines()]
    assert command in lines
    verl = "bash plugins/verl/scripts/run_tests.sh -q"
    assert verl in readme and verl in lines
    assert lines.index(command) < lines.index(verl)


def test_ci_runs_in_a_fresh_virtual_environment() -> None:
    """A venv hides nothing the base interpreter provides (tests/plugins/test_third_party.py
    once passed only outside one)."""
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    create = next(i for i, ln in enumerate(lines) if re.fullmatch(r"python3? -m venv (\S+)", ln))
    env_dir = lines[create].split()[-1]
    activate = lines.index(f"source {env_dir}/bin/activate")
    first_install = next(i for i, ln in enumerate(lines) if "scripts/setup.sh" in ln or "pip install" in ln)
    assert create < activate < first_install
    assert lines.index(f"rm -rf {env_dir}") < create  # fresh, not left over from the last run
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert any(Path(env_dir).match(pattern.rstrip("/")) for pattern in ignored if pattern.strip())


def test_readme_main_command() -> None:
    assert "bash scripts/setup.sh && python -m core.train" in (ROOT / "README.md").read_text()


def test_readme_names_every_test_command_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in ci if ln.startswith(("python -m pytest", "bash plugins/"))]
    assert {"python -m pytest -m long", "python -m pytest -m ray", "python -m pytest -m frameworks"} <= set(commands)
    for command in commands:
        assert command in readme, command


def test_readme_is_a_newcomers_page() -> None:
    """What it is, a picture, the two commands, choosing things, layout, what runs where, links:
    figures live in docs/performance.md."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 100
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (ROOT / image).is_file() and (ROOT / image).stat().st_size < 300_000, image
    assert "docs/performance.md" in readme

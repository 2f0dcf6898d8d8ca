"""Docs stay true: every hook is documented, README's commands are what CI runs."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from core.plugins import hookspecs

ROOT = Path(__file__).resolve().parents[2]


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


SETUP_AND_TRAIN = "bash scripts/setup.sh && source .venv/bin/activate && python -m core.train"
SETUP_AND_TEST = "bash scripts/setup.sh test && source .venv/bin/activate && python -m pytest -n auto --dist loadfile"
"""README's two commands (tests/meta/test_readme_commands.py runs them in a fresh copy)."""


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP_AND_TEST in readme
    lines = [ln.strip() for ln in ci.splitlines()]
    assert SETUP_AND_TEST in lines
    verl = "bash plugins/verl/scripts/run_tests.sh -q"
    assert verl in readme and verl in lines
    assert lines.index(SETUP_AND_TEST) < lines.index(verl)


def test_ci_runs_in_a_fresh_virtual_environment() -> None:
    """A venv hides nothing the base interpreter provides (tests/plugins/test_third_party.py
    once passed only outside one): CI's first install is README's test command, which makes
    `.venv` (removed first, so nothing is left over from the last run) and activates it."""
    text = (ROOT / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    first_install = next(
        i for i, ln in enumerate(lines) if "scripts/setup.sh" in ln or "pip install" in ln or " -m venv " in ln
    )
    assert lines[first_install] == SETUP_AND_TEST
    assert not any(ln.startswith(("source ", ". ")) for ln in lines[:first_install])  # no other venv first
    assert lines.index("rm -rf .venv") < first_install
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'VENV="${TRACERL_VENV:-.venv}"' in setup and '-m venv "$VENV"' in setup
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert any(Path(".venv").match(pattern.rstrip("/")) for pattern in ignored if pattern.strip())


def test_readme_main_command() -> None:
    assert SETUP_AND_TRAIN in (ROOT / "README.md").read_text()


def test_readme_names_every_test_command_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in ci if ln.startswith(("python -m pytest", "bash plugins/"))]
    assert {"python -m pytest -m long -n 3 --dist loadfile", "python -m pytest -m ray",
            "python -m pytest -m frameworks"} <= set(commands)
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


def _doc_pages() -> list[Path]:
    """README and the guides (docs/research/ cites other repositories' paths, so it is left out)."""
    pages = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return pages + sorted((ROOT / "docs" / "backends").glob("*.md"))


def _module_file(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The longest prefix of a dotted name that is a module of this checkout, and the rest."""
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, parts[i:]
    return None


def test_paths_and_modules_the_docs_name_exist() -> None:
    """Code moves; the pages that name a path (`core/rollout/`) or a module (`core.gateway.app._loads`)
    must move with it. Python examples are left out: they show a plugin author's own files."""
    missing = []
    for page in _doc_pages():
        text = re.sub(r"```python\n.*?```", "", page.read_text(), flags=re.DOTALL)
        for path in re.findall(r"(?<![\w./-])((?:core|plugins|tests|benchmarks|examples|scripts)/[\w./<>-]*\w)", text):
            if "<" not in path and not (ROOT / path).exists():  # `<model>`: a placeholder
                missing.append(f"{page.relative_to(ROOT)}: {path}")
        for dotted in re.findall(r"(?<![\w./-])(core(?:\.\w+)+)", text):
            found = _module_file(dotted.split("."))
            if found is None or (found[1] and not re.search(rf"\b{found[1][0]}\b", found[0].read_text())):
                missing.append(f"{page.relative_to(ROOT)}: {dotted}")
    assert not missing, "\n".join(missing)

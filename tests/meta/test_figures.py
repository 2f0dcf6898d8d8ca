"""Figures live in docs/performance.md, generated from benchmarks/results/, each with its command."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "figures.py"
PAGE = ROOT / "docs" / "performance.md"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tracerl_figures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_performance_page_is_what_the_kept_results_generate() -> None:
    """Edit benchmarks/results/ and run `python benchmarks/figures.py --write-page`, not the page."""
    module = _module()
    text = PAGE.read_text()
    start, end = text.index(module.BEGIN), text.index(module.END) + len(module.END) + 1
    assert text[start:end] == module.performance_page_part(), "run: python benchmarks/figures.py --write-page"
    for name in (p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json")):
        assert f"`{name}`" in text, name


def test_every_figure_has_an_entry_and_its_pages_link_to_the_performance_page() -> None:
    figures = _module().FIGURES
    assert {f.name for f in figures} >= {"default_run", "local_runtime", "ray_runtime", "gateway_append", "seeds",
                                        "traces", "stored_response_memory", "frameworks_tests"}
    text = PAGE.read_text()
    for figure in figures:
        assert re.search(rf"^### {figure.name}$", text, re.MULTILINE), figure.name
        assert f"python benchmarks/figures.py --only {figure.name}" in text, figure.name
        for page in figure.quoted_in:
            assert "performance.md" in (ROOT / page).read_text(), (figure.name, page)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_into_the_performance_page_has_its_entry() -> None:
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", PAGE.read_text(), re.MULTILINE)}
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    links = [
        (name, anchor)
        for name in files
        if name.endswith((".md", ".py", ".yaml", ".toml")) and (ROOT / name).is_file()
        for anchor in re.findall(r"performance\.md#([\w-]+)", (ROOT / name).read_text())
    ]
    assert len(links) >= 20
    assert [(name, anchor) for name, anchor in links if anchor not in anchors] == []


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


def test_write_page_rewrites_only_the_generated_part(tmp_path: Path) -> None:
    module = _module()
    page = tmp_path / "performance.md"
    page.write_text(f"# hand-written head\n\n{module.BEGIN}\nstale\n{module.END}\n\n## hand-written tail\n")
    assert module.write_page(page) is True
    text = page.read_text()
    assert text.startswith("# hand-written head\n") and text.endswith("\n## hand-written tail\n")
    assert "stale" not in text and "### default_run" in text
    assert module.write_page(page) is False


def test_no_dated_or_load_qualified_figure_outside_the_performance_page() -> None:
    """Measured figures carry their date and load in docs/performance.md (and the kept results)
    only; other pages link there, so a number is stated once and cannot go stale unnoticed."""
    files = subprocess.run(
        ["git", "ls-files", "*.md", "*.yaml", "*.yml", "*pyproject.toml"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    exempt = {"docs/performance.md"}
    dated = re.compile(r"20\d\d-\d\d-\d\d|load average", re.IGNORECASE)
    hits = [
        f"{name}:{number}: {line.strip()}"
        for name in files
        if name not in exempt and not name.startswith("benchmarks/results/") and (ROOT / name).is_file()
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if dated.search(line)
    ]
    assert not hits, "\n".join(hits)

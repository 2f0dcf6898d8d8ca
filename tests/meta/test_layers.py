"""The import graph keeps the architecture's shape: no circle between modules, and no
folder of ``core`` importing one above it (the layers below), except the entry points.

The layers, lowest first; a folder may import its own modules and any lower layer's:

0. data contracts: ``types``, ``errors``, and ``conf`` (the YAML configs)
1. foundations: ``interfaces``, ``http``, ``tokenizer``, ``plugins``, ``safe_regex``,
   ``config_nodes``, ``remote_sdk``
2. the pieces a rollout is made of: ``algo``, ``agent``, ``gateway``, ``samplers``,
   ``tokenizer_export``
3. what runs them and where they land: ``runtime``, ``tasks``, ``rundir``
4. one rollout: ``rollout``
5. what scores rollouts: ``rewards``
6. what reads rollouts: ``eval``, ``view``
7. the training loop: ``trainer``
8. composition and entry points: ``config``, ``testing``, ``train``, ``entry``, ``export``
   and every ``__main__``

Imports inside functions count: a lazy import hides a dependency, it does not remove it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: dict[str, int] = {
    "types": 0,
    "errors": 0,
    "conf": 0,
    "interfaces": 1,
    "http": 1,
    "tokenizer": 1,
    "plugins": 1,
    "safe_regex": 1,
    "config_nodes": 1,
    "remote_sdk": 1,
    "algo": 2,
    "agent": 2,
    "gateway": 2,
    "samplers": 2,
    "tokenizer_export": 2,
    "runtime": 3,
    "tasks": 3,
    "rundir": 3,
    "rollout": 4,
    "rewards": 5,
    "eval": 6,
    "view": 6,
    "trainer": 7,
    "config": 8,
    "testing": 8,
    "train": 8,
    "entry": 8,
    "export": 8,
}
ENTRY_POINTS = {"core.train", "core.entry"}


def _modules() -> dict[str, Path]:
    """Every module of ``core`` and of the in-tree plugins' packages, by dotted name."""
    found: dict[str, Path] = {}
    roots = [ROOT] + sorted(p for p in (ROOT / "plugins").iterdir() if p.is_dir())
    for base in roots:
        for path in base.rglob("*.py"):
            rel = path.relative_to(base)
            top = rel.parts[0]
            if base == ROOT and top != "core":
                continue
            if base != ROOT and not top.startswith("tracerl_"):
                continue
            name = ".".join(rel.with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``path`` imports, at module level or inside functions."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        # A package importing its own children (re-exports) is not a circle.
        graph[name] = {m for m in _imports(path, known) if m != name and not m.startswith(name + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def _folder(module: str) -> str:
    return module.split(".")[1]


def test_no_module_imports_another_that_imports_it_back() -> None:
    circles = _circles(_graph())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_every_folder_of_core_has_a_layer() -> None:
    folders = {_folder(m) for m in _modules() if m.startswith("core.")}
    assert folders <= set(LAYERS), f"add these to LAYERS (and the docstring): {sorted(folders - set(LAYERS))}"


def test_no_folder_imports_one_above_it() -> None:
    upward: list[str] = []
    for module, imported in _graph().items():
        if not module.startswith("core.") or module in ENTRY_POINTS or module.endswith("__main__"):
            continue
        for target in imported:
            if not target.startswith("core."):
                continue
            here, there = _folder(module), _folder(target)
            if here != there and LAYERS[there] > LAYERS[here]:
                upward.append(f"{module} (layer {LAYERS[here]}) imports {target} (layer {LAYERS[there]})")
    assert not upward, "\n".join(sorted(upward))


def test_plugins_import_core_but_core_imports_no_plugin() -> None:
    leaks = [
        f"{module} imports {target}"
        for module, imported in _graph().items()
        if module.startswith("core.") or module == "core"
        for target in imported
        if target.startswith("tracerl_")
    ]
    assert not leaks, "\n".join(sorted(leaks))


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    """A function-level import counts (the circles this suite replaced were all lazy)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from core.types import TraceRecord\n")
    assert _imports(source, {"core.types": source}) == {"core.types"}

"""What plugin authors import stays importable: ``__all__`` and every import docs/plugins.md shows."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from core.runtime import LocalRuntimeConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


@dataclass
class PooledConfig:
    """A runtime plugin's own node: one field of its own plus the local pool's settings."""

    name: str = "pooled"
    label: str = "x"
    pool: LocalRuntimeConfig = field(default_factory=LocalRuntimeConfig)


@pytest.mark.parametrize(
    "module",
    ["core.plugins", "core.testing", "core.runtime", "core.interfaces", "core.types", "core.agent", "core.rewards", "core.eval",
     "core.rollout", "core.rundir"],
)
def test_every_name_in_all_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    assert names, f"{module} must declare __all__"
    for name in names:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def _documented_imports() -> list[tuple[str, str]]:
    """``(module, name)`` for each ``from core... import ...`` in the doc's python blocks."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    out: list[tuple[str, str]] = []
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("core"):
                out.extend((node.module, alias.name) for alias in node.names)
    return out


def test_docs_import_only_public_names() -> None:
    imports = _documented_imports()
    assert len(imports) >= 8, imports  # the doc shows the plugin, the tests and the wrapping
    for module, name in imports:
        mod = importlib.import_module(module)
        assert name in getattr(mod, "__all__", ()), f"docs/plugins.md imports {module}.{name}, not in __all__"
        assert getattr(mod, name) is not None


def test_a_wrapping_runtime_plugin_builds_local_runtime_from_its_own_node() -> None:
    """A runtime plugin that owns a node (an extra field and the local pool's settings) builds
    LocalRuntime through public names only."""
    from core.plugins import RuntimeSpec, hookimpl, load_plugins
    from core.runtime import LocalRuntime
    from core.testing import build_runtime

    def factory(cfg: Any) -> LocalRuntime:
        return LocalRuntime.from_config(cfg, node=cfg.runtime.pool)

    @hookimpl
    def tracerl_register_runtimes(registry):  # type: ignore[no-untyped-def]
        registry.add(RuntimeSpec(name="pooled", factory=factory, config=PooledConfig))

    module = ModuleType("pooled_plugin")
    module.tracerl_register_runtimes = tracerl_register_runtimes  # type: ignore[attr-defined]
    runtime = build_runtime(
        "pooled",
        ["task.agent=my_agent:app", "runtime.pool.num_processes=3", "runtime.label=y"],
        load_plugins(extra_plugins=(module,)),
    )
    assert isinstance(runtime, LocalRuntime)
    assert runtime.config.num_processes == 3 and runtime.agent == "my_agent:app"
    assert runtime.config.name == "local"


def _block(first_line: str) -> str:
    """The doc's fenced block that starts with ``first_line`` (a file-name comment)."""
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", DOC.read_text(), flags=re.S):
        if block.startswith(first_line + "\n"):
            return block
    raise AssertionError(f"docs/plugins.md has no block starting with {first_line!r}")


def _module(name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, f"docs/plugins.md:{name}", "exec"), module.__dict__)
    return module


def test_the_minimal_distribution_in_the_docs_is_complete_and_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from core.plugins import load_plugins
    from core.testing import build_backend

    project = tomllib.loads(_block("# pyproject.toml"))
    assert project["project"]["version"] and project["build-system"]["build-backend"]
    assert project["project"]["entry-points"]["tracerl"] == {"hello": "tracerl_hello.plugin"}
    plugin = _module("tracerl_hello.plugin", _block("# tracerl_hello/plugin.py"), monkeypatch)
    plugins = load_plugins(extra_plugins=(plugin,))
    assert plugins.problems == [] and plugins.backend("hello").kind == "driving"
    backend = build_backend("hello", ["backend.greeting=bonjour", "trainer.max_steps=3"], plugins)
    cfg = __import__("core.testing", fromlist=["compose_config"]).compose_config(
        ["backend=hello", "backend.greeting=bonjour", "trainer.max_steps=3"], plugins
    )
    assert backend.run(cfg) == 0
    assert capsys.readouterr().out == "bonjour, 3 steps, seed 0\n"


def test_the_worked_runtime_plugin_in_the_docs_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    from core.plugins import load_plugins
    from core.runtime import LocalRuntime
    from core.testing import build_runtime

    monkeypatch.setitem(sys.modules, "tracerl_mypool", ModuleType("tracerl_mypool"))
    _module("tracerl_mypool.runtime", _block("# tracerl_mypool/runtime.py"), monkeypatch)
    plugin = _module("tracerl_mypool.plugin", _block("# tracerl_mypool/plugin.py"), monkeypatch)
    plugins = load_plugins(extra_plugins=(plugin,))
    assert plugins.problems == []
    runtime = build_runtime(
        "mypool", ["task.agent=my_agent:app", "runtime.pool.num_processes=3"], plugins
    )
    assert type(runtime).__name__ == "MypoolRuntime"
    assert isinstance(runtime._pool, LocalRuntime) and runtime._pool.config.num_processes == 3

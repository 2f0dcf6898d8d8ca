"""The plugin manager: registration, origins, duplicates, blocking and bad plugins."""

from __future__ import annotations

import itertools
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from core.errors import BackendNotFoundError, ConfigError, PluginError
from core.plugins import BackendSpec, RuntimeSpec, hookimpl, load_plugins


@dataclass
class _Cfg:
    name: str = "fake"


_COUNTER = itertools.count()


def _module(**hooks: Any) -> ModuleType:
    """A plugin object, as pluggy gets from an entry point (hashable, unlike SimpleNamespace)."""
    module = ModuleType(f"test_plugin_{next(_COUNTER)}")
    for key, value in hooks.items():
        setattr(module, key, value)
    return module


def _plugin(name: str = "fake", kind: str = "driven") -> ModuleType:
    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        registry.add(BackendSpec(name=name, kind=kind, factory=lambda cfg: None, config=_Cfg(name)))

    return _module(tracerl_register_backends=tracerl_register_backends)


def test_builtin_runtime_and_installed_local_backend() -> None:
    plugins = load_plugins()
    assert "local" in plugins.runtimes
    assert plugins.runtimes.origin("local").plugin == "core.runtime.plugin"
    origin = plugins.backends.origin("local")
    assert origin.distribution == "tracerl-local"
    assert origin.version


def test_extra_plugin_registers_backend() -> None:
    plugins = load_plugins(extra_plugins=(_plugin(),))
    assert plugins.backend("fake").kind == "driven"


def test_duplicate_name_is_unusable_and_names_both_plugins() -> None:
    first, second = _plugin("twin"), _plugin("twin")
    plugins = load_plugins(extra_plugins=(first, second, _plugin("single")))
    assert plugins.backend("single").name == "single"  # the rest still works
    with pytest.raises(PluginError, match="registered by plugin") as info:
        plugins.backend("twin")
    assert first.__name__ in str(info.value) and second.__name__ in str(info.value)
    assert f"TRACERL_DISABLE_PLUGINS={second.__name__}" in str(info.value)
    assert [p.kind for p in plugins.problems] == ["duplicate"]


def test_third_registration_of_a_name_is_named_too() -> None:
    plugs = (_plugin("tri"), _plugin("tri"), _plugin("tri"))
    problems = load_plugins(extra_plugins=plugs).problems
    assert len(problems) == 1
    assert all(p.__name__ in problems[0].message for p in plugs)


def test_bad_name_drops_only_that_plugin() -> None:
    bad = _plugin("Bad Name")
    plugins = load_plugins(extra_plugins=(bad, _plugin("good")))
    assert "good" in plugins.backends
    (problem,) = plugins.problems
    assert problem.origin.plugin == bad.__name__ and "'Bad Name'" in problem.message


def test_config_name_mismatch_is_rejected_at_load_naming_the_plugin() -> None:
    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        registry.add(BackendSpec(name="mine", kind="driven", factory=lambda cfg: None, config=_Cfg))
        registry.add(BackendSpec(name="other", kind="driven", factory=lambda cfg: None, config={}))

    mod = _module(tracerl_register_backends=tracerl_register_backends)
    plugins = load_plugins(extra_plugins=(mod,))
    assert "other" in plugins.backends and plugins.backends.node("other").name == "other"
    with pytest.raises(PluginError) as info:
        plugins.backend("mine")
    assert "config whose name is 'fake'" in str(info.value)
    assert f"plugin {mod.__name__!r}" in str(info.value)


def test_bad_kind_and_uncallable_factory_are_rejected() -> None:
    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        registry.add(BackendSpec(name="k", kind="drivn", factory=lambda cfg: None, config={}))  # type: ignore[arg-type]
        registry.add(BackendSpec(name="f", kind="driven", factory="nope", config={}))  # type: ignore[arg-type]

    plugins = load_plugins(extra_plugins=(_module(tracerl_register_backends=tracerl_register_backends),))
    messages = " ".join(p.message for p in plugins.problems)
    assert "kind 'drivn'" in messages and "not callable" in messages


def test_unknown_hook_drops_the_plugin_naming_the_hook() -> None:
    @hookimpl
    def tracerl_register_everything(registry):  # type: ignore[no-untyped-def]
        pass

    plugins = load_plugins(extra_plugins=(_module(tracerl_register_everything=tracerl_register_everything),))
    (problem,) = plugins.problems
    assert "tracerl_register_everything" in problem.message
    assert "local" in plugins.runtimes


def test_plugin_that_raises_is_named_and_its_names_dropped() -> None:
    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        registry.add(BackendSpec(name="half", kind="driven", factory=lambda cfg: None, config={}))

    @hookimpl
    def tracerl_register_runtimes(registry):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    mod = _module(
        tracerl_register_backends=tracerl_register_backends,
        tracerl_register_runtimes=tracerl_register_runtimes,
    )
    plugins = load_plugins(extra_plugins=(mod, _plugin("half")))
    (problem,) = plugins.problems
    assert re.search(r"failed in tracerl_register_runtimes: KeyError: 'boom'", problem.message)
    assert "Traceback" in problem.detail
    # its half-done registration is gone, so the other plugin's "half" is no longer a duplicate
    assert plugins.backends.origin("half").plugin != mod.__name__
    # asking for a name the broken plugin would provide fails with its message
    with pytest.raises(PluginError, match="Set TRACERL_DEBUG=1 for the traceback") as info:
        plugins.runtime(mod.__name__)
    assert "Traceback" not in str(info.value)


def test_debug_flag_puts_the_traceback_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    mod = _module(tracerl_register_backends=tracerl_register_backends)
    monkeypatch.setenv("TRACERL_DEBUG", "1")
    plugins = load_plugins(extra_plugins=(mod,))
    with pytest.raises(PluginError, match=r"(?s)KeyError: 'boom'.*Traceback \(most recent call last\)"):
        plugins.backend(mod.__name__)


def test_blocked_plugin_is_not_loaded_and_says_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACERL_DISABLE_PLUGINS", "local")
    plugins = load_plugins()
    assert "local" not in plugins.backends
    assert [b.origin.plugin for b in plugins.blocked] == ["local"]
    with pytest.raises(BackendNotFoundError, match="backend 'local' is blocked") as info:
        plugins.backend("local")
    assert "pip install" not in str(info.value)


def test_blocking_core_runtime_plugin_says_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACERL_DISABLE_PLUGINS", "core.runtime.plugin")
    with pytest.raises(ConfigError, match="runtime 'agentcore' is blocked"):
        load_plugins().runtime("agentcore")


def test_block_matching_nothing_warns_with_the_right_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACERL_DISABLE_PLUGINS", "tracerl-local, nosuch")
    plugins = load_plugins()
    assert "local" in plugins.backends  # a distribution name blocks nothing
    first, second = plugins.unmatched_blocks
    assert "'tracerl-local' matches no plugin" in first and "TRACERL_DISABLE_PLUGINS=local" in first
    assert "'nosuch' matches no plugin" in second and "local" in second
    assert plugins.warnings()[-2:] == [first, second]


def test_unknown_backend_lists_installed() -> None:
    plugins = load_plugins(extra_plugins=(_plugin("fake"),))
    with pytest.raises(BackendNotFoundError) as info:
        plugins.backend("nope")
    listed = str(info.value).split("Installed backends: ")[1].rstrip(".").split(", ")
    assert {"fake", "local"} <= set(listed)
    assert listed == sorted(listed) == list(info.value.installed)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, LookupError)
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.installed == info.value.installed


def test_missing_in_tree_backend_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from core.plugins import manager

    monkeypatch.setitem(manager.IN_TREE_BACKENDS, "nosuch", "tracerl-nosuch")
    with pytest.raises(BackendNotFoundError, match=r"tracerl-nosuch.*pip install -e plugins/nosuch"):
        load_plugins().backend("nosuch")


def test_missing_verl_points_to_its_own_environment_not_pip() -> None:
    """verl pins an older transformers: `pip install -e plugins/verl` here would break tracerl."""
    with pytest.raises(BackendNotFoundError) as info:
        load_plugins().backend("verl")
    message = str(info.value)
    assert "bash plugins/verl/scripts/setup_venv.sh" in message
    assert "source .venv-verl/bin/activate" in message
    assert "pip install" not in message


def test_unknown_runtime_lists_installed() -> None:
    with pytest.raises(ConfigError, match=r"Installed runtimes: (\w+, )*local\b"):
        load_plugins().runtime("kubernetes")


def test_runtime_spec_registered_by_plugin() -> None:
    @hookimpl
    def tracerl_register_runtimes(registry):  # type: ignore[no-untyped-def]
        registry.add(RuntimeSpec(name="mine", factory=lambda cfg: None, config={"workers": 3}))

    plugins = load_plugins(extra_plugins=(_module(tracerl_register_runtimes=tracerl_register_runtimes),))
    assert plugins.runtime("mine").config == {"workers": 3}


def _dist_info(root: Path, dist: str, version: str, entry: str) -> None:
    """An installed distribution as importlib.metadata finds it on sys.path (a .dist-info folder)."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[tracerl]\n{entry}\n")


def test_entry_point_name_claimed_by_two_distributions_is_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "clash_one.py").write_text("")
    (tmp_path / "clash_two.py").write_text("")
    _dist_info(tmp_path, "tracerl-clash-one", "1.0", "clash = clash_one")
    _dist_info(tmp_path, "tracerl-clash-two", "2.0", "clash = clash_two")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins()
    (problem,) = [p for p in plugins.problems if p.origin.plugin == "clash"]
    assert problem.message.startswith("entry point 'clash' is claimed by distribution tracerl-clash-")
    assert "tracerl-clash-one 1.0 (clash_one)" in problem.message
    assert "tracerl-clash-two 2.0 (clash_two)" in problem.message
    loaded = plugins.manager.get_plugin("clash").__name__  # whichever sys.path listed first
    assert f"only tracerl-clash-{loaded.split('_')[1]}'s is loaded" in problem.message

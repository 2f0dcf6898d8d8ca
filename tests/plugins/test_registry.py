"""The plugin manager: registration, origins, duplicates, blocking and bad plugins."""

from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass
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
        registry.add(BackendSpec(name=name, kind=kind, factory=lambda cfg: None, config=_Cfg))

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


def test_duplicate_name_names_both_plugins() -> None:
    with pytest.raises(PluginError, match="registered twice"):
        load_plugins(extra_plugins=(_plugin("twin"), _plugin("twin")))


def test_bad_name_is_rejected() -> None:
    with pytest.raises(PluginError, match="'Bad Name'"):
        load_plugins(extra_plugins=(_plugin("Bad Name"),))


def test_unknown_hook_is_rejected() -> None:
    @hookimpl
    def tracerl_register_everything(registry):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(PluginError, match="tracerl_register_everything"):
        load_plugins(extra_plugins=(_module(tracerl_register_everything=tracerl_register_everything),))


def test_plugin_that_raises_is_named() -> None:
    @hookimpl
    def tracerl_register_runtimes(registry):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    with pytest.raises(PluginError, match="failed in tracerl_register_runtimes.*boom"):
        load_plugins(extra_plugins=(_module(tracerl_register_runtimes=tracerl_register_runtimes),))


def test_blocked_plugin_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACERL_DISABLE_PLUGINS", "local")
    plugins = load_plugins()
    assert "local" not in plugins.backends
    with pytest.raises(BackendNotFoundError, match="pip install -e plugins/local"):
        plugins.backend("local")


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

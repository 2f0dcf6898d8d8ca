"""Building the plugin manager and the registries it fills.

``load_plugins()`` is the one entry point: it blocks the plugins named in
``TRACERL_DISABLE_PLUGINS``, loads the ``tracerl`` entry-point group (unless
``TRACERL_DISABLE_PLUGIN_AUTOLOAD`` is set), registers core's own plugins,
rejects implementations of unknown hooks, and calls the registration hooks
one plugin at a time so every spec remembers who registered it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import pluggy

from core.errors import BackendNotFoundError, PluginError
from core.plugins import hookspecs
from core.plugins.registry import (
    BackendRegistry,
    BackendSpec,
    Registration,
    RuntimeRegistry,
    RuntimeSpec,
)

ENTRY_POINT_GROUP = "tracerl"
DISABLE_ENV = "TRACERL_DISABLE_PLUGINS"
NO_AUTOLOAD_ENV = "TRACERL_DISABLE_PLUGIN_AUTOLOAD"

# Core's own plugin modules, registered like any third-party plugin.
BUILTIN_PLUGINS: tuple[str, ...] = ("core.runtime.plugin",)

# Backends that live in this repository but ship as separate distributions:
# when one is asked for and missing, say which install fixes it.
IN_TREE_BACKENDS: dict[str, str] = {
    "local": "tracerl-local",
    "tinker": "tracerl-tinker",
    "sagemaker": "tracerl-sagemaker",
    "verl": "tracerl-verl",
    "slime": "tracerl-slime",
}

# In-tree backends that must not be pip-installed into this environment, and
# what to do instead.
OWN_ENVIRONMENT: dict[str, str] = {
    "verl": (
        "verl 0.9.1 pins transformers<5.11, so it never goes into the environment that runs "
        "the rest of tracerl: build its own with `bash plugins/verl/scripts/setup_venv.sh` "
        "(creates .venv-verl), then `source .venv-verl/bin/activate` and run this command "
        "there (docs/backends/verl.md; `bash plugins/verl/scripts/run_tests.sh` runs its tests)."
    ),
}


@dataclass
class Plugins:
    """The loaded plugin manager with its filled registries (a typed facade)."""

    manager: pluggy.PluginManager
    backends: BackendRegistry
    runtimes: RuntimeRegistry

    def backend(self, name: str) -> BackendSpec:
        """The backend registered as ``name``.

        Raises:
            BackendNotFoundError: naming the installed backends and, for an
                in-tree backend, the ``pip install`` that provides it.
        """
        spec = self.backends.get(name)
        if spec is not None:
            return spec
        installed = tuple(self.backends.names())
        listing = ", ".join(installed) if installed else "none"
        if name in OWN_ENVIRONMENT:
            hint = (
                f"backend {name!r} is provided by the {IN_TREE_BACKENDS[name]!r} distribution, "
                f"which is not installed here. {OWN_ENVIRONMENT[name]}"
            )
        elif name in IN_TREE_BACKENDS:
            dist = IN_TREE_BACKENDS[name]
            hint = (
                f"backend {name!r} is provided by the {dist!r} distribution, which is not "
                f"installed. Install it with `pip install -e plugins/{name}` from a tracerl "
                f"checkout (or `pip install {dist}`)."
            )
        else:
            hint = (
                f"unknown backend {name!r}. A third-party backend is a pip-installable plugin "
                f"registering itself in the {ENTRY_POINT_GROUP!r} entry-point group; see "
                "docs/plugins.md."
            )
        raise BackendNotFoundError(
            f"{hint} Installed backends: {listing}.", name=name, installed=installed
        )

    def runtime(self, name: str) -> RuntimeSpec:
        """The runtime registered as ``name``; raises ``ConfigError`` listing the installed ones."""
        spec = self.runtimes.get(name)
        if spec is None:
            from core.errors import ConfigError

            raise ConfigError(
                f"unknown runtime {name!r}. Installed runtimes: "
                f"{', '.join(self.runtimes.names()) or 'none'}."
            )
        return spec


def _blocked_names() -> set[str]:
    raw = os.environ.get(DISABLE_ENV, "")
    return {n.strip() for n in raw.split(",") if n.strip()}


def _distribution_of(pm: pluggy.PluginManager) -> dict[int, tuple[str, str]]:
    out: dict[int, tuple[str, str]] = {}
    for plugin, dist in pm.list_plugin_distinfo():
        out[id(plugin)] = (dist.metadata["name"], dist.version)
    return out


def load_plugins(*, extra_plugins: tuple[Any, ...] = ()) -> Plugins:
    """Build the plugin manager and fill the backend and runtime registries.

    Args:
        extra_plugins: Plugin objects to register as well (tests use this).

    Raises:
        PluginError: a plugin failed to import, implements an unknown hook,
            or registered an invalid or duplicate name.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in _blocked_names():
        pm.set_blocked(name)

    import importlib

    for module_name in BUILTIN_PLUGINS:
        if pm.is_blocked(module_name):
            continue
        pm.register(importlib.import_module(module_name), name=module_name)
    if not os.environ.get(NO_AUTOLOAD_ENV):
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception as exc:  # an import error inside someone's plugin
            raise PluginError(
                f"a plugin in the {ENTRY_POINT_GROUP!r} entry-point group failed to load: "
                f"{type(exc).__name__}: {exc}. Block it with {DISABLE_ENV}=<name> to run without it."
            ) from exc
    for plugin in extra_plugins:
        pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"invalid tracerl plugin: {exc}") from exc

    dists = _distribution_of(pm)
    backends, runtimes = BackendRegistry(), RuntimeRegistry()
    for plugin_name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked
            continue
        dist = dists.get(id(plugin))
        origin = Registration(
            plugin=plugin_name,
            distribution=dist[0] if dist else None,
            version=dist[1] if dist else None,
        )
        others = [p for p in pm.get_plugins() if p is not plugin]
        for hook_name, registry in (
            ("tracerl_register_backends", backends),
            ("tracerl_register_runtimes", runtimes),
        ):
            caller = pm.subset_hook_caller(hook_name, remove_plugins=others)
            registry._current = origin
            try:
                caller(registry=registry)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {plugin_name!r} failed in {hook_name}: {type(exc).__name__}: {exc}"
                ) from exc
        backends._current = runtimes._current = replace(origin, plugin="<direct>")
    return Plugins(manager=pm, backends=backends, runtimes=runtimes)

"""Plugin system: hook markers, specs and the loader.

A plugin module implements hooks from ``core.plugins.hookspecs`` with the
``hookimpl`` marker and is listed in the ``tracerl`` entry-point group.
Everything in ``__all__`` is public and documented in docs/plugins.md;
``tests/plugins/test_public_api.py`` keeps it importable.
"""

from __future__ import annotations

from core.plugins.hookspecs import hookimpl, hookspec
from core.plugins.manager import (
    DEBUG_ENVS,
    DISABLE_ENV,
    ENTRY_POINT_GROUP,
    IN_TREE_BACKENDS,
    NO_AUTOLOAD_ENV,
    BlockedPlugin,
    Plugins,
    load_plugins,
)
from core.plugins.registry import (
    BackendKind,
    BackendRegistry,
    BackendSpec,
    PluginProblem,
    Registration,
    RewardRegistry,
    RewardSpec,
    RuntimeRegistry,
    RuntimeSpec,
)

__all__ = [
    "DEBUG_ENVS",
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "IN_TREE_BACKENDS",
    "NO_AUTOLOAD_ENV",
    "BackendKind",
    "BackendRegistry",
    "BackendSpec",
    "BlockedPlugin",
    "PluginProblem",
    "Plugins",
    "Registration",
    "RewardRegistry",
    "RewardSpec",
    "RuntimeRegistry",
    "RuntimeSpec",
    "hookimpl",
    "hookspec",
    "load_plugins",
]

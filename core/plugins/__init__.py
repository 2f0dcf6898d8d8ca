"""Plugin system: hook markers, specs and the loader.

A plugin module implements hooks from ``core.plugins.hookspecs`` with the
``hookimpl`` marker and is listed in the ``tracerl`` entry-point group.
"""

from __future__ import annotations

from core.plugins.hookspecs import hookimpl, hookspec
from core.plugins.manager import (
    DISABLE_ENV,
    ENTRY_POINT_GROUP,
    IN_TREE_BACKENDS,
    Plugins,
    load_plugins,
)
from core.plugins.registry import (
    BackendRegistry,
    BackendSpec,
    Registration,
    RuntimeRegistry,
    RuntimeSpec,
)

__all__ = [
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "IN_TREE_BACKENDS",
    "BackendRegistry",
    "BackendSpec",
    "Plugins",
    "Registration",
    "RuntimeRegistry",
    "RuntimeSpec",
    "hookimpl",
    "hookspec",
    "load_plugins",
]

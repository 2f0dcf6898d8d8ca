"""Rollout runtimes that ship with core, public for plugins that wrap or extend them.

- ``LocalRuntime``: the ``local`` runtime (a pool of local agent processes).
- ``LocalRuntimeConfig``: its config node (``runtime/local``); subclass it to
  add fields in a plugin's own node, then build with
  ``LocalRuntime.from_config(cfg, node=cfg.runtime)``.

``LocalRuntime`` is imported on first use, so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.runtime.config import LocalRuntimeConfig

if TYPE_CHECKING:
    from core.runtime.local import LocalRuntime

__all__ = ["LocalRuntime", "LocalRuntimeConfig"]


def __getattr__(name: str) -> Any:
    if name == "LocalRuntime":
        from core.runtime.local import LocalRuntime

        return LocalRuntime
    raise AttributeError(f"module 'core.runtime' has no attribute {name!r}")

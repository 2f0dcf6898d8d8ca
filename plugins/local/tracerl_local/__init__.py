"""tracerl-local: the single-machine torch backend (``backend=local``).

Public for plugins that extend or wrap it (imported on first use, so
``import tracerl_local`` does not import torch):

- ``LocalBackend``: build with ``LocalBackend.from_config(cfg, node=...)``.
- ``LocalBackendConfig``: its config node; nest it in your own node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tracerl_local.backend import LocalBackend
    from tracerl_local.config import LocalBackendConfig

__all__ = ["LocalBackend", "LocalBackendConfig", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from tracerl_local.backend import LocalBackend

        return LocalBackend
    if name == "LocalBackendConfig":
        from tracerl_local.config import LocalBackendConfig

        return LocalBackendConfig
    raise AttributeError(f"module 'tracerl_local' has no attribute {name!r}")

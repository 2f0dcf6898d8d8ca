"""Reading a setting off a config node of any shape (DictConfig, dataclass or dict).

Plugins receive the composed config as Hydra gives it; tests and third parties
sometimes pass a dict or a dataclass instead. ``cfg_get`` reads all three alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cfg_get(node: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a DictConfig, dataclass or dict node, with a default."""
    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(key, default)
    getter = getattr(node, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            return default
    return getattr(node, key, default)

"""The ``ray`` runtime: agent sessions on a Ray cluster (``runtime=ray``).

- ``RayRuntime``: the runtime (imported on first use: it needs the ``ray`` extra).
- ``RayRuntimeConfig``: its config node (``runtime/ray``).
- ``check_gateway_reachable``: the loopback-gateway preflight against node IPs.

Importing this package does not import ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.runtime.ray._preflight import check_gateway_reachable
from core.runtime.ray.config import RayRuntimeConfig

if TYPE_CHECKING:
    from core.runtime.ray.runtime import RayRuntime

__all__ = ["RayRuntime", "RayRuntimeConfig", "check_gateway_reachable"]


def __getattr__(name: str) -> Any:
    if name == "RayRuntime":
        from core.runtime.ray.runtime import RayRuntime

        return RayRuntime
    raise AttributeError(f"module 'core.runtime.ray' has no attribute {name!r}")

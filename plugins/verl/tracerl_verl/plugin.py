"""Registers ``backend=verl`` with tracerl (entry point ``tracerl: verl``).

Importing this module must stay cheap and must not import verl: plugins are
listed in environments where verl is absent (the system Python of a
developer who only uses the local backend).
"""

from __future__ import annotations

from typing import Any

from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_verl.config import VerlBackendConfig


def _make_backend(cfg: Any) -> Any:
    from tracerl_verl.backend import VerlBackend

    return VerlBackend(cfg)


@hookimpl
def tracerl_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            name="verl",
            kind="driving",
            factory=_make_backend,
            config=VerlBackendConfig,
            description="stock verl (main_ppo, v1 trainer) on Ray; our gateway and runtime inside its agent loop",
        )
    )

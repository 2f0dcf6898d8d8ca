"""Registers ``backend=slime`` with tracerl (entry point ``tracerl: slime``).

Importing this module must stay cheap and must not import slime: plugins are
listed in environments where slime is absent.
"""

from __future__ import annotations

from typing import Any

from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_slime.config import SlimeBackendConfig


def _make_backend(cfg: Any) -> Any:
    from tracerl_slime.backend import SlimeBackend

    return SlimeBackend(cfg)


@hookimpl
def tracerl_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            name="slime",
            kind="driving",
            factory=_make_backend,
            config=SlimeBackendConfig,
            description="slime (Megatron + SGLang on Ray); our gateway and runtime inside its custom generate function",
        )
    )

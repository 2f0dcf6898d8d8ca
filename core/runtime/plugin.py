"""Core's own plugin: registers the built-in ``local`` runtime."""

from __future__ import annotations

from typing import Any

from core.plugins.hookspecs import hookimpl
from core.plugins.registry import RuntimeRegistry, RuntimeSpec
from core.runtime.config import LocalRuntimeConfig


def _make_local(cfg: Any) -> Any:
    from core.runtime.local import LocalRuntime

    return LocalRuntime.from_config(cfg)


@hookimpl
def tracerl_register_runtimes(registry: RuntimeRegistry) -> None:
    registry.add(
        RuntimeSpec(
            name="local",
            factory=_make_local,
            config=LocalRuntimeConfig,
            description="agent app served by a pool of local processes",
        )
    )

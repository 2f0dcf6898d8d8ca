"""Registers ``backend=local`` with tracerl (entry point ``tracerl: local``)."""

from __future__ import annotations

from typing import Any

from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_local.config import LocalBackendConfig


def _make_backend(cfg: Any) -> Any:
    # torch is imported here, not at registration, so listing plugins stays fast.
    from tracerl_local.backend import LocalBackend

    return LocalBackend.from_config(cfg)


@hookimpl
def tracerl_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            name="local",
            kind="driven",
            factory=_make_backend,
            config=LocalBackendConfig,
            description="torch on this machine (CPU or one GPU); tiny offline model by default",
            # Several policies: core builds one LocalBackend per policy (its own model copy,
            # optimizer, sampler and weight version; docs/multi_agent.md).
            multi_policy=True,
        )
    )

"""Registers ``backend=local`` with tracerl (entry point ``tracerl: local``)."""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError
from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_local.config import LocalBackendConfig

POLICY_SETTINGS = ("lora.enabled", "lora.rank", "lora.alpha", "lora.dropout", "lora.target_modules")
"""What ``policies.<name>.backend`` may set on the local backend: each policy is a model copy
of its own, so its LoRA adapter may be its own too."""


def _check_policy(node: Any, keys: list[str]) -> None:
    """An adapter setting does nothing with LoRA off: refuse it rather than train without it."""
    adapter = [k for k in keys if k.startswith("lora.") and k != "lora.enabled"]
    if adapter and not bool(node.lora.enabled):
        raise ConfigError(
            f"sets {adapter}, but LoRA is off for this policy (backend.lora.enabled=false); "
            "set lora.enabled: true in the policy's backend settings (or backend.lora.enabled=true "
            "for every policy), or drop them"
        )


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
            # A policy's own adapter (policies.<name>.backend.lora.*) on its own model copy.
            policy_settings=POLICY_SETTINGS,
            check_policy=_check_policy,
        )
    )

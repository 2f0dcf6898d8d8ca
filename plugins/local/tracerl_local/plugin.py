"""Registers ``backend=local`` with tracerl (entry point ``tracerl: local``)."""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError
from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_local.config import LocalBackendConfig

POLICY_SETTINGS = (
    "model",
    "tiny.hidden_size",
    "tiny.intermediate_size",
    "tiny.num_layers",
    "tiny.num_heads",
    "lora.enabled",
    "lora.rank",
    "lora.alpha",
    "lora.dropout",
    "lora.target_modules",
)
"""What ``policies.<name>.backend`` may set on the local backend: each policy is a model of
its own, so it may be another model (of the same tokenizer: core checks) or another shape of
``tiny``, and its LoRA adapter may be its own too."""


def _check_policy(node: Any, keys: list[str]) -> None:
    """An adapter setting does nothing with LoRA off, a ``tiny`` shape nothing for another model:
    refuse them rather than train without them."""
    shape = [k for k in keys if k.startswith("tiny.")]
    if shape and str(node.model) != "tiny":
        raise ConfigError(
            f"sets {shape}, but this policy's model is {str(node.model)!r}, not 'tiny'; drop them"
        )
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

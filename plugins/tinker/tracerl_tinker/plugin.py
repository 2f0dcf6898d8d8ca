"""Registers ``backend=tinker`` with tracerl (entry point ``tracerl: tinker``)."""

from __future__ import annotations

from typing import Any

from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_tinker.config import TinkerBackendConfig


def _make_backend(cfg: Any) -> Any:
    # The tinker SDK is imported here, not at registration, so listing plugins stays fast.
    from tracerl_tinker.backend import TinkerBackend

    return TinkerBackend.from_config(cfg)


@hookimpl
def tracerl_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            name="tinker",
            kind="driven",
            factory=_make_backend,
            config=TinkerBackendConfig,
            description="LoRA training and sampling in the Tinker service (needs TINKER_API_KEY)",
            # Several policies: core builds one TinkerBackend per policy, each with its own
            # training and sampling client, weight version and checkpoints named for the
            # policy (docs/backends/tinker.md, docs/multi_agent.md).
            multi_policy=True,
            # A policy's own LoRA training client: its rank and where adapters go.
            policy_settings=("lora_rank", "train_mlp", "train_attn", "train_unembed", "seed"),
        )
    )

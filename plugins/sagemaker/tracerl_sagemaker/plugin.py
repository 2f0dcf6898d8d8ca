"""Registers ``backend=sagemaker`` with tracerl (entry point ``tracerl: sagemaker``)."""

from __future__ import annotations

from typing import Any

from core.plugins import BackendRegistry, BackendSpec, hookimpl
from tracerl_sagemaker.config import SageMakerBackendConfig


def _make_backend(cfg: Any) -> Any:
    # The SDK (and boto3) are imported here, not at registration, so listing plugins stays fast.
    from tracerl_sagemaker.backend import SageMakerBackend

    return SageMakerBackend.from_config(cfg)


@hookimpl
def tracerl_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            name="sagemaker",
            kind="driven",
            factory=_make_backend,
            config=SageMakerBackendConfig,
            description="LoRA training in SageMaker training sessions (needs role_arn, region)",
        )
    )

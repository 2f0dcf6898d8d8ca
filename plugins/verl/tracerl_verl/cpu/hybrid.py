"""Trainer-side glue of the CPU path: weight push, FSDP on ``cpu``, gloo process groups.

Defines ``LocalRolloutAdapter`` (the ``BaseRollout`` verl's hybrid worker
builds for rollout ``tracerl_cpu``) and ``register()``.

Two registrations patch private verl 0.9.1 names (``tracerl_verl.cpu.install``
checks the version first):

1. ``verl/workers/rollout/base.py:89`` ``_ROLLOUT_REGISTRY`` is a closed dict
   (vllm, sglang, trtllm) that ``get_rollout_class`` asserts on (line 106),
   called from ``verl/workers/engine_workers.py:667``: we add our adapter.
2. ``verl/utils/distributed.py:89`` builds the process-group backend
   ``f"cpu:gloo,{device}:{backend}"``, i.e. ``"cpu:gloo,cpu:gloo"`` on a CPU
   platform, which torch rejects; ``verl/workers/engine_workers.py:89`` calls
   it, so we rebind that module's name to pass ``backend="cpu:gloo"``.
"""

from __future__ import annotations

import os
from typing import Any

NO_SYNC_ENV = "TRACERL_VERL_CPU_NO_SYNC"
"""Set to 1 to skip the weight push (the negative control of the weight-sync test)."""


def _adapter_class() -> type:
    import ray
    import torch
    from verl.workers.rollout.base import BaseRollout

    from tracerl_verl.cpu.replica import SERVER_NAME

    class LocalRolloutAdapter(BaseRollout):  # type: ignore[misc]
        """Pushes the trainer's weights to the CPU server on every sync."""

        def __init__(
            self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any
        ) -> None:
            super().__init__(config, model_config, device_mesh)
            self.replica_rank = 0

        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        async def update_weights(
            self, weights: Any, *args: Any, global_steps: int | None = None, **kwargs: Any
        ) -> None:
            state = {name: tensor.detach().to("cpu").clone() for name, tensor in weights}
            if torch.distributed.get_rank() != 0 or os.environ.get(NO_SYNC_ENV) == "1":
                return
            server = ray.get_actor(SERVER_NAME.format(rank=self.replica_rank))
            await server.load_state_dict.remote(state, int(global_steps or 0))

    return LocalRolloutAdapter


LocalRolloutAdapter: Any = None


def register() -> None:
    global LocalRolloutAdapter
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.rollout import base as rollout_base

    LocalRolloutAdapter = _adapter_class()
    rollout_base._ROLLOUT_REGISTRY[("tracerl_cpu", "async")] = (
        "tracerl_verl.cpu.hybrid.LocalRolloutAdapter"
    )

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    try:
        EngineRegistry.register(
            model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu"
        )(FSDPEngineWithLMHead)
    except AssertionError:
        pass  # already registered in this process

    import verl.workers.engine_workers as engine_workers
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray

    def init_process_group(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    engine_workers.initialize_global_process_group_ray = init_process_group

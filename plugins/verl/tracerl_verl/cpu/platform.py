"""A ``cpu`` platform for verl's platform registry (verl 0.9.1 ships cuda, npu and rocm).

Selected with ``VERL_PLATFORM=cpu``. Devices are ``"cpu"``, collectives use
gloo, and the ``torch.cuda``-style calls verl makes through
``get_torch_device()`` (memory stats, caches, RNG state) answer with no-ops
or zeros. Ray placement still asks for an accelerator resource, so the
launcher declares logical GPUs (``ray_init.num_gpus``) and this platform
names that resource ``GPU``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_ZERO_STATS = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")
_NOOPS = (
    "empty_cache",
    "ipc_collect",
    "set_per_process_memory_fraction",
    "reset_peak_memory_stats",
    "set_device",
)


class _CPUDevice(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` API verl calls, made harmless."""

    def __getattr__(self, name: str) -> Any:
        if name in _NOOPS:
            return lambda *a, **k: None
        if name in _ZERO_STATS:
            return lambda *a, **k: 0
        if name == "mem_get_info":
            return lambda *a, **k: (16 << 30, 16 << 30)
        if name == "get_rng_state":
            return lambda *a, **k: torch.get_rng_state()
        if name == "set_rng_state":
            return lambda state, *a, **k: torch.set_rng_state(state)
        if name in ("manual_seed", "manual_seed_all"):
            return torch.manual_seed
        if name == "get_device_name":
            return lambda *a, **k: "cpu"
        if name == "is_available":
            return lambda: True
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        raise AttributeError(f"the CPU device shim has no {name!r}")


DEVICE = _CPUDevice("tracerl_verl_cpu_device")


def register() -> None:
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    class PlatformCPU(PlatformBase):  # type: ignore[misc]
        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return DEVICE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return True

        def current_device(self) -> Any:
            # a device *name*, so verl's `.to(get_device_id())` lands on CPU
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    if "cpu" not in PlatformRegistry.registered_names():
        PlatformRegistry.register(platform="cpu")(PlatformCPU)

"""Sampling from an inference fleet (vLLM or SGLang over HTTP) while the driven backend trains.

Defines:

- ``SamplerConfig``: the ``sampler`` config node. ``sampler=backend`` (the
  default) samples with the backend's own sampler; ``sampler=vllm`` or
  ``sampler=sglang`` with ``sampler.urls`` samples from those servers through
  ``core.samplers`` (the ``HttpSamplerConfig`` fields, named ``sampler.<field>``
  in errors), plus where the pushed weights go and how long a push may take.
- ``Fleet``: the HTTP sampler and its ``WeightPusher``. ``Fleet.push`` writes the
  backend's weights into ``sampler.weights_dir/v<version>`` with the backend's
  ``export_weights`` and loads them into every server; the loop rebinds the
  gateway only after it returns (every server reported the version).
- ``build_fleet``: the ``Fleet`` for a run, None for ``sampler=backend``, or a
  ``ConfigError`` naming what to use when the backend cannot write weights to disk.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from core.errors import ConfigError
from core.samplers.factory import build_http_sampler
from core.samplers.http_sampler import HttpSampler, HttpSamplerConfig
from core.samplers.weights import PushReport, WeightPusher

__all__ = ["FLEET_KINDS", "SAMPLER_CHOICES", "Fleet", "SamplerConfig", "build_fleet"]

FLEET_KINDS = ("vllm", "sglang")
SAMPLER_CHOICES = ("backend", *FLEET_KINDS)

# Driven backends that keep their weights on a remote service: what to say instead.
_NO_DISK_WEIGHTS = {
    "tinker": "Tinker trains and samples on its own service and gives no weights on disk to push",
    "sagemaker": "SageMaker training sessions keep the weights in the remote session and give none on disk to push",
}


@dataclass
class SamplerConfig(HttpSamplerConfig):
    """Who samples during training: the backend, or a vLLM/SGLang fleet (docs/samplers.md)."""

    key_prefix: ClassVar[str] = "sampler"
    urls_example: ClassVar[str] = "sampler.urls='[http://10.0.0.5:30000,http://10.0.0.6:30000]'"

    kind: str = "backend"
    """``backend`` (the backend's own sampler), ``vllm`` or ``sglang`` (servers at ``urls``)."""
    weights_dir: str = ""
    """Where each step's weights are written for the servers to load (a path every server
    can read: the same machine or a shared filesystem); empty means ``<run_dir>/sampler_weights``."""
    update_timeout_s: float = 600.0
    """Limit for one server's whole weight update: all its calls together (vLLM makes three),
    load from disk and version check."""
    keep_weights: int = 1
    """Pushed weight directories kept on disk (the newest); older ones are deleted."""


def sampler_config(node: Any) -> SamplerConfig:
    """``SamplerConfig`` from the composed ``sampler`` node (or a default when absent)."""
    if node is None:
        return SamplerConfig()
    if isinstance(node, SamplerConfig):
        return node
    if not isinstance(node, DictConfig):
        node = OmegaConf.create(node)
    merged = OmegaConf.merge(OmegaConf.structured(SamplerConfig), node)
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, SamplerConfig)
    return obj


class Fleet:
    """An HTTP sampler over the servers and the pusher that keeps their weights current."""

    def __init__(self, config: SamplerConfig, run_dir: Path) -> None:
        """Validate ``config`` (``ConfigError`` names the ``sampler.<field>``); nothing connects yet."""
        if config.update_timeout_s <= 0:
            raise ConfigError(f"sampler.update_timeout_s must be > 0, got {config.update_timeout_s!r}")
        if config.keep_weights < 1:
            raise ConfigError(f"sampler.keep_weights must be >= 1, got {config.keep_weights!r}")
        self.config = config
        self.sampler: HttpSampler = build_http_sampler(config)
        self.pusher = WeightPusher(self.sampler, update_timeout_s=config.update_timeout_s)
        self.weights_dir = Path(config.weights_dir or run_dir / "sampler_weights").resolve()
        self.last: PushReport | None = None
        self._unreported_s = 0.0
        """Push time since ``metrics`` last reported it."""

    async def push(self, backend: Any) -> PushReport:
        """Export ``backend``'s weights (at its ``weight_version``) and load them on every server.

        Raises:
            RunAborted: every server failed the update.
        """
        t0 = time.perf_counter()
        version = int(backend.weight_version)
        path = await backend.export_weights(str(self.weights_dir / f"v{version:06d}"))
        report = await self.pusher.push(str(path), version)
        report.seconds = time.perf_counter() - t0
        self._prune()
        self.last = report
        self._unreported_s += report.seconds
        return report

    def _prune(self) -> None:
        pushed = sorted(p for p in self.weights_dir.glob("v*") if p.is_dir() and p.name[1:].isdigit())
        for old in pushed[: -self.config.keep_weights]:
            shutil.rmtree(old, ignore_errors=True)

    def metrics(self) -> dict[str, Any]:
        """Per-step keys: servers in rotation, retired so far, time spent pushing since the
        last call (0 on a step that pushed nothing, not the previous push's time again)."""
        pushed, self._unreported_s = self._unreported_s, 0.0
        return {
            "sampler/servers": len(self.sampler.pool.servers),
            "sampler/retired": len(self.sampler.pool.retired),
            "time/weight_push": pushed,
        }

    async def aclose(self) -> None:
        await self.sampler.aclose()


def build_fleet(cfg: DictConfig, backend: Any, run_dir: Path) -> Fleet | None:
    """The run's ``Fleet``, or None for ``sampler=backend``.

    Raises:
        ConfigError: an unknown ``sampler.kind``, a bad field, or a backend
            that cannot write its weights to disk (named, with what to use).
    """
    config = sampler_config(cfg.get("sampler"))
    if config.kind == "backend":
        return None
    if config.kind not in FLEET_KINDS:
        raise ConfigError(f"sampler.kind={config.kind!r} is not supported; use one of {SAMPLER_CHOICES}")
    name = str(getattr(backend, "name", cfg.backend.name))
    if not callable(getattr(backend, "export_weights", None)):
        why = _NO_DISK_WEIGHTS.get(
            name, f"backend {name!r} has no export_weights(path) to write its weights to disk"
        )
        raise ConfigError(
            f"sampler={config.kind} needs the trained weights on disk for the servers to load, but {why}. "
            f"Use sampler=backend with backend={name}, or backend=local to train with a {config.kind} fleet "
            "(docs/samplers.md)"
        )
    return Fleet(config, run_dir)

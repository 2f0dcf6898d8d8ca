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
  gateway only after it returns (every server reported the version). Then the
  logprob probe (``core.trainer.probe``) compares each server's logprobs with
  the backend's on a fixed prompt; a server past ``sampler.logprob_tolerance``
  is retired, and with none left the run stops. A server re-pushed between
  pushes (back from unhealthy, ``ServerPool.readmit``) is probed before any
  traffic against the last probe's trainer logprobs (``reprobe_server``).
  With ``sampler.sleep_during_train`` (sync runs) ``Fleet.before_train`` puts the
  servers to sleep before an optimizer step and ``Fleet.push`` wakes them before
  loading the new weights (``core.samplers.sleep``).
- ``FleetProbe``: what the probe samples and scores with (the loss's settings).
- ``build_fleet``: the ``Fleet`` for a run, None for ``sampler=backend``, or a
  ``ConfigError`` naming what to use when the backend cannot write weights to disk.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from core.errors import ConfigError, RunAborted, SamplerError
from core.samplers.factory import build_http_sampler
from core.samplers.http_pool import ServerState
from core.samplers.http_sampler import HttpSampler, HttpSamplerConfig
from core.samplers.sleep import SLEEP_LEVELS, FleetSleeper
from core.samplers.weights import PushReport, WeightPusher
from core.trainer.overrides import loss_sampling
from core.trainer.probe import (
    ProbeResult,
    check_unnormalised,
    probe_prompt,
    probe_server,
    reprobe_server,
)
from core.types import SamplingParams

__all__ = ["FLEET_KINDS", "SAMPLER_CHOICES", "Fleet", "FleetProbe", "SamplerConfig", "build_fleet"]

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
    logprob_probe: bool = True
    """At start-up and after each push, compare every server's logprobs on a fixed prompt
    with the backend's own (its ``forward``) and retire a server past ``logprob_tolerance``."""
    logprob_tolerance: float = 0.1
    """Largest mean |server - trainer| logprob per probe token (nats) a server may show.
    bf16 engines differ from the trainer by a few hundredths; a temperature the engine
    does not apply to its reported logprobs differs by tenths or more."""
    processed_logprobs: bool = False
    """Declare that the servers report the logprobs of the distribution they sample from
    (vLLM started with ``--logprobs-mode processed_logprobs``). Without it, a training
    temperature other than 1 (vLLM) or a top-p/top-k (both engines) is refused, since the
    engine reports those logprobs unnormalised; the probe checks the claim."""
    sleep_during_train: bool = False
    """``trainer.mode=sync`` only: put every server to sleep before each optimizer step (its
    GPU memory freed for a trainer on the same GPU) and wake it before the push
    (``core.samplers.sleep``; vLLM needs ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``,
    SGLang ``--enable-memory-saver``)."""
    sleep_level: int = 1
    """vLLM's sleep level: 1 keeps a CPU copy of the weights, 2 frees it too (the push after
    each wake reloads the full weights from disk). SGLang ignores it."""


@dataclass(frozen=True)
class FleetProbe:
    """What the logprob probe samples with and how the backend scores it."""

    loss_fn: str
    """``algorithm.loss``."""
    loss_config: dict[str, float] = field(default_factory=dict)
    """The ``loss_config`` the loop trains with (its ``temperature``, ``top_p``, ``top_k``)."""
    params: SamplingParams = field(default_factory=SamplingParams)
    """The settings the loop's sessions sample with."""


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

    def __init__(self, config: SamplerConfig, run_dir: Path, *, probe: FleetProbe | None = None) -> None:
        """Validate ``config`` (``ConfigError`` names the ``sampler.<field>``); nothing connects yet.

        ``probe``: the loss's settings for the logprob probe (None: no probe).
        """
        if config.update_timeout_s <= 0:
            raise ConfigError(f"sampler.update_timeout_s must be > 0, got {config.update_timeout_s!r}")
        if config.keep_weights < 1:
            raise ConfigError(f"sampler.keep_weights must be >= 1, got {config.keep_weights!r}")
        if not config.logprob_tolerance > 0:
            raise ConfigError(
                f"sampler.logprob_tolerance must be > 0, got {config.logprob_tolerance!r} "
                "(sampler.logprob_probe=false turns the probe off)"
            )
        if config.sleep_level not in SLEEP_LEVELS:
            raise ConfigError(f"sampler.sleep_level must be 1 or 2, got {config.sleep_level!r}")
        self.config = config
        self.probe = probe if config.logprob_probe else None
        self.probed: list[ProbeResult] = []
        """The last probe's results, one per server."""
        self._warned_no_forward = False
        self.sampler: HttpSampler = build_http_sampler(config)
        self.pusher = WeightPusher(self.sampler, update_timeout_s=config.update_timeout_s)
        self.sleeper = (
            FleetSleeper(self.pusher, level=config.sleep_level, timeout_s=config.update_timeout_s)
            if config.sleep_during_train
            else None
        )
        self.sampler.pool.readmit = self._readmit  # the pusher's re-push, then the probe
        self._reference: ProbeResult | None = None
        """A probe that passed at the last push: what a server coming back is compared with."""
        self._prompt: list[int] = []
        self._awaiting_push: set[str] = set()
        """Servers back from unhealthy whose probe could not be scored: out until the next push."""
        self.weights_dir = Path(config.weights_dir or run_dir / "sampler_weights").resolve()
        self.last: PushReport | None = None
        self._unreported_s = 0.0
        """Push time since ``metrics`` last reported it."""
        self.after_push: list[Callable[[PushReport], Awaitable[None]]] = []
        """Called with the push's report once it succeeded (the probe included): the gateway
        shards' samplers learn its version and retired servers (``GatewayShards.announce``)."""

    async def push(self, backend: Any) -> PushReport:
        """Export ``backend``'s weights (at its ``weight_version``) and load them on every server.

        Raises:
            RunAborted: every server failed the update.
        """
        version = int(backend.weight_version)
        if self.sleeper is not None:  # servers that slept through the step wake for the weights
            await self.sleeper.wake(version)
        t0 = time.perf_counter()
        path = await backend.export_weights(str(self.weights_dir / f"v{version:06d}"))
        self._awaiting_push.clear()  # pushed and probed now with the others
        report = await self.pusher.push(str(path), version)
        if self.probe is not None:
            await self._probe(backend, self.probe, report)
        for tell in self.after_push:
            await tell(report)
        report.seconds = time.perf_counter() - t0
        self._prune()
        self.last = report
        self._unreported_s += report.seconds
        return report

    async def before_train(self) -> None:
        """Before an optimizer step: with ``sampler.sleep_during_train``, every server sleeps
        (``push`` wakes them); otherwise nothing."""
        if self.sleeper is not None:
            await self.sleeper.sleep()

    async def _probe(self, backend: Any, probe: FleetProbe, report: PushReport) -> None:
        """Compare each updated server's logprobs with the backend's; retire those past the
        tolerance (``RunAborted`` when none is left)."""
        if not callable(getattr(backend, "forward", None)):
            if not self._warned_no_forward:
                self._warned_no_forward = True
                print(
                    f"warning: backend {getattr(backend, 'name', '?')!r} has no forward(datums, loss_fn, "
                    "loss_config): the fleet's logprobs cannot be compared with the trainer's "
                    "(sampler.logprob_probe); watch train/logprob_diff_max",
                    file=sys.stderr,
                )
            return
        pool = self.sampler.pool
        tolerance = self.config.logprob_tolerance
        self.probed = []
        self._reference = None
        self._prompt = probe_prompt(backend.get_tokenizer())
        loss = (probe.loss_fn, probe.loss_config)
        for server in [s for s in pool.servers if s.url in report.updated]:
            try:
                result = await probe_server(self.sampler, server, backend, loss, probe.params)
            except SamplerError as exc:  # it took the weights but cannot answer: not usable
                reason = f"the probe request failed: {exc}"
            else:
                self.probed.append(result)
                if result.mean_abs_diff <= tolerance:
                    if self._reference is None and result.tokens:
                        self._reference = result
                    continue
                reason = (
                    f"its logprobs differ from the trainer's by {result.mean_abs_diff:.3f} per token on "
                    f"average (max {result.max_abs_diff:.3f}, {result.tokens} tokens) > "
                    f"sampler.logprob_tolerance={tolerance:g}"
                )
            self.pusher.retire(server, reason, report.version, what="the logprob probe at")
            report.retired[server.url] = reason
            report.updated.remove(server.url)
        if not report.updated:
            p = probe.params
            raise RunAborted(
                f"no inference server reports the trainer's logprobs at temperature={p.temperature!r}, "
                f"top_p={p.top_p!r}, top_k={p.top_k!r} "
                f"({'; '.join(f'{u}: {r}' for u, r in report.retired.items())}). Check that the servers "
                "serve the trained model in the trainer's dtype and report the logprobs of the "
                "distribution they sample from (vLLM: --logprobs-mode processed_logprobs), or sample at "
                "temperature 1 without top-k/top-p (docs/samplers.md)"
            )

    async def _readmit(self, server: ServerState) -> bool:
        """A server back from unhealthy: re-pushed (``WeightPusher.readmit``), then probed
        before any traffic against the last push's probe, not the backend (whose weights
        may already be past the pushed ones). True when it may serve."""
        if server.url in self._awaiting_push:
            return False
        if not await self.pusher.readmit(server):
            return False
        reference, probe, current = self._reference, self.probe, self.pusher.current
        if probe is None or reference is None or current is None:
            return True
        tolerance = self.config.logprob_tolerance
        try:
            result = await reprobe_server(self.sampler, server, reference, self._prompt, probe.params)
        except SamplerError as exc:
            reason = f"the probe request failed: {exc}"
        else:
            if result is None:
                self._awaiting_push.add(server.url)
                print(
                    f"note: {self.sampler.protocol} server {server.url} came back but sampled other probe "
                    f"tokens than {reference.url} at the same seed; it gets no traffic until the next push "
                    "probes it against the trainer",
                    file=sys.stderr,
                )
                return False
            self.probed = [r for r in self.probed if r.url != server.url] + [result]
            if result.mean_abs_diff <= tolerance:
                return True
            reason = (
                f"its logprobs differ from the trainer's by {result.mean_abs_diff:.3f} per token on "
                f"average (max {result.max_abs_diff:.3f}, {result.tokens} tokens) > "
                f"sampler.logprob_tolerance={tolerance:g}"
            )
        self.pusher.retire(server, reason, current[1], what="the logprob probe on coming back, at")
        return False

    def _prune(self) -> None:
        pushed = sorted(p for p in self.weights_dir.glob("v*") if p.is_dir() and p.name[1:].isdigit())
        for old in pushed[: -self.config.keep_weights]:
            shutil.rmtree(old, ignore_errors=True)

    def metrics(self) -> dict[str, Any]:
        """Per-step keys: servers in rotation, retired so far, waiting for the current weights
        (back from unhealthy or restarted), time spent pushing since the last call (0 on a
        step that pushed nothing, not the previous push's time again), with
        ``sleep_during_train`` the time spent putting servers to sleep and waking them, and with the probe
        the largest server's mean logprob difference."""
        pushed, self._unreported_s = self._unreported_s, 0.0
        pool = self.sampler.pool
        out: dict[str, Any] = {
            "sampler/servers": len(pool.servers),
            "sampler/retired": len(pool.retired),
            "sampler/waiting_for_weights": sum(s.needs_weights for s in pool.servers),
            "time/weight_push": pushed,
        }
        if self.sleeper is not None:
            out["time/sampler_sleep_s"], out["time/sampler_wake_s"] = self.sleeper.take_times()
        if self.probe is not None:
            out["sampler/probe_logprob_diff"] = max((r.mean_abs_diff for r in self.probed), default=0.0)
        return out

    async def aclose(self) -> None:
        """Wake servers still asleep (the run stopped mid-step: they stay usable), then close."""
        if self.sleeper is not None and self.sleeper.asleep:
            current = self.pusher.current
            await self.sleeper.wake(current[1] if current is not None else 0)
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
    algo = cfg.get("algorithm") or {}
    sampling = loss_sampling(
        _Algo(float(algo.get("temperature", 1.0)), dict(algo.get("loss_config") or {}))
    )
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    check_unnormalised(config.kind, params, processed_logprobs=config.processed_logprobs)
    loss_config = {**dict(algo.get("loss_config") or {}), "temperature": sampling.temperature}
    probe = FleetProbe(str(algo.get("loss", "ppo")), loss_config, params)
    return Fleet(config, run_dir, probe=probe)


@dataclass(frozen=True)
class _Algo:
    """The ``algorithm`` fields ``loss_sampling`` reads."""

    temperature: float
    loss_config: dict[str, Any]

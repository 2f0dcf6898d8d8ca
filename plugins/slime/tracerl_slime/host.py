"""The per-process gateway + runtime that slime's generate calls share.

Defines ``WorkerHost``, ``router_url`` and ``tracerl_config_of``.

slime calls the custom generate function once per sample, concurrently, on
one persistent background event loop of its rollout process
(``slime.utils.async_utils``). So the gateway (sampling through the SGLang
router), its HTTP server, the rollout runtime and the ``RolloutRunner`` are
a process singleton started on first use inside that loop, like the verl
plugin's ``WorkerHost``. The tracerl config arrives on ``args`` itself (key
``tracerl``, set by slime from ``--custom-config-path``), so it reaches
every Ray actor that holds ``args`` without a shared filesystem.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from core.errors import ConfigError, TrainingError

logger = logging.getLogger("tracerl_slime.host")

CONFIG_ATTR = "tracerl"
"""Attribute of slime's ``args`` holding the composed tracerl config (a dict)."""

SamplerFactory = Callable[[Any, Any, Any], Any]
"""``(args, cfg, tokenizer) -> core.interfaces.Sampler``."""


def router_url(args: Any) -> str:
    """Base URL of slime's SGLang router (``--sglang-router-ip/-port``, set by slime at start)."""
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise ConfigError(
            f"slime's args have sglang_router_ip={ip!r}, sglang_router_port={port!r}; generate() must run "
            "inside slime's rollout process (slime sets both when it starts the router)"
        )
    host = f"[{ip}]" if ":" in str(ip) and not str(ip).startswith("[") else str(ip)
    return f"http://{host}:{int(port)}"


def tracerl_config_of(args: Any) -> Any:
    """The tracerl config slime put on ``args`` from ``--custom-config-path``."""
    from omegaconf import DictConfig, OmegaConf

    raw = getattr(args, CONFIG_ATTR, None)
    if raw is None:
        raise ConfigError(
            f"slime's args have no {CONFIG_ATTR!r} entry: launch slime with `python -m core.train "
            "backend=slime` (it passes tracerl's config through --custom-config-path), or add a "
            f"top-level {CONFIG_ATTR!r} mapping to your --custom-config-path YAML"
        )
    if isinstance(raw, DictConfig):
        return raw
    if isinstance(raw, str):
        return OmegaConf.load(raw)
    return OmegaConf.create(raw)


def default_sampler(args: Any, cfg: Any, tokenizer: Any) -> Any:
    """The HTTP SGLang sampler (``core.samplers``) over slime's router.

    ``backend.sampler`` adds or overrides ``HttpSamplerConfig`` keys (timeouts,
    ``extra_sampling_params``, ``return_routed_experts``...). The routing header is
    sent when slime's router uses ``--router-policy consistent_hashing``.
    """
    from omegaconf import OmegaConf

    from core.samplers.factory import build_http_sampler

    extra = cfg.backend.get("sampler") or {}
    if not isinstance(extra, dict):
        extra = OmegaConf.to_container(extra, resolve=True)
    settings: dict[str, Any] = {
        "kind": "sglang",
        "urls": [router_url(args)],
        "affinity_header": str(getattr(args, "router_policy", "") or "") == "consistent_hashing",
        "return_routed_experts": bool(getattr(args, "use_rollout_routing_replay", False)),
    }
    settings.update(dict(extra))
    return build_http_sampler(settings)


def _public_host(host: str) -> str:
    """An address other machines can dial when the gateway binds every interface."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return host


class WorkerHost:
    """Gateway, its HTTP server, runtime and rollout runner of one slime rollout process."""

    sampler_factory: SamplerFactory = default_sampler
    """How the sampler is built (tests swap in a scripted one before the first call)."""
    _instance: WorkerHost | None = None
    _lock: asyncio.Lock | None = None
    _lock_loop: asyncio.AbstractEventLoop | None = None

    def __init__(
        self, cfg: Any, tokenizer: Any, gateway: Any, server: Any, runtime: Any, runner: Any
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.gateway = gateway
        self.server = server
        self.runtime = runtime
        self.runner = runner
        self.loop = asyncio.get_running_loop()
        self.stats = {"rollouts": 0, "failed": 0, "samples": 0}
        window = max(32, int(cfg.trainer.batch_size) * int(cfg.trainer.group_size))
        self._recent: deque[bool] = deque(maxlen=window)

    @classmethod
    async def get(cls, args: Any) -> WorkerHost:
        """The process's host, started on first call (concurrent first calls share one start)."""
        inst = cls._instance
        if inst is not None and inst.loop is asyncio.get_running_loop():
            return inst
        loop = asyncio.get_running_loop()
        if cls._lock is None or cls._lock_loop is not loop:
            # an asyncio.Lock binds to the loop it is first awaited in
            cls._lock, cls._lock_loop = asyncio.Lock(), loop
        async with cls._lock:
            if cls._instance is None or cls._instance.loop is not asyncio.get_running_loop():
                if cls._instance is not None:
                    logger.warning(
                        "slime called generate() from a new event loop; starting a new gateway"
                    )
                cls._instance = await cls._start(args)
        return cls._instance

    @classmethod
    async def _start(cls, args: Any) -> WorkerHost:
        from omegaconf import OmegaConf

        from core.gateway import Gateway, GatewayConfig
        from core.rollout import start_rollout_stack
        from core.tokenizer import load_tokenizer

        cfg = tracerl_config_of(args)
        tokenizer = load_tokenizer(
            str(getattr(args, "hf_checkpoint", None) or cfg.backend.hf_checkpoint)
        )
        gw_cfg = GatewayConfig(**OmegaConf.to_container(cfg.gateway, resolve=True))  # type: ignore[arg-type]
        context = getattr(args, "rollout_max_context_len", None)
        if context:
            gw_cfg.max_context_tokens = int(context)
        sampler = cls.sampler_factory(args, cfg, tokenizer)
        model_id = str(getattr(args, "hf_checkpoint", None) or cfg.backend.hf_checkpoint)
        gateway = Gateway(tokenizer=tokenizer, sampler=sampler, config=gw_cfg, model_id=model_id)
        public = gw_cfg.public_host
        if not public and gw_cfg.host in ("0.0.0.0", "::"):
            public = _public_host(gw_cfg.host)
        stack = await start_rollout_stack(cfg, gateway, model_id=model_id, public_host=public)
        server, runtime, runner = stack.server, stack.runtime, stack.runner
        logger.info("tracerl gateway for this slime rollout process at %s", server.base_url)
        return cls(cfg, tokenizer, gateway, server, runtime, runner)

    def record(self, failed: bool) -> None:
        """Count a rollout; raise once the recent failure rate passes ``trainer.max_failure_rate``.

        Raises:
            TrainingError: when the window is full and too many rollouts failed, so a run
                whose agents cannot reach the gateway stops instead of training on nothing.
        """
        self.stats["rollouts"] += 1
        self.stats["failed"] += int(failed)
        self._recent.append(failed)
        limit = float(self.cfg.trainer.max_failure_rate)
        if len(self._recent) == self._recent.maxlen:
            rate = sum(self._recent) / len(self._recent)
            if rate > limit:
                raise TrainingError(
                    f"{rate:.0%} of the last {len(self._recent)} rollouts failed (trainer.max_failure_rate="
                    f"{limit}); see the rollouts' metadata['tracerl']['error'] and the agent logs"
                )

    @classmethod
    async def shutdown(cls) -> None:
        """Stop the runtime and the gateway server (tests; slime kills its actors at exit)."""
        host, cls._instance = cls._instance, None
        cls._lock, cls._lock_loop = None, None
        if host is not None:
            await host.runtime.aclose()
            await host.server.stop()
            close = getattr(host.gateway.sampler, "aclose", None)
            if close is not None:
                await close()

"""The ``ray`` runtime: agent sessions on a Ray cluster (``runtime=ray``).

Defines ``RayRuntime`` (a ``core.interfaces.RolloutRuntime``).

Ray does the cluster work: it places ``num_actors`` ``AgentHost`` actors by
resources, labels and strategy, carries requests and results, and recreates an
actor whose process or node died (``max_restarts``). Each actor runs the
user's agent app as ``runtime=local`` does, on its own node, so every agent
fault has the same status on both runtimes. This driver side only picks the
least busy actor with room, maps Ray's errors (a dead actor, a lost node) to failed
results, forwards cancellation and kills its actors on ``aclose``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, RuntimeStartError
from core.runtime._results import failed
from core.runtime._run_config import (
    advertised_gateway_host,
    agent_app,
    check_agent_ref,
    node_values,
    with_overrides,
)
from core.runtime.base import RolloutClock, RuntimeBase
from core.runtime.config import AgentServerSettings, LocalRuntimeConfig
from core.runtime.ray._preflight import (
    RAY_INSTALL_HINT,
    check_gateway_reachable,
    check_private_ray_auth,
    check_ray_version,
)
from core.runtime.ray.calls import awaitable, call_all
from core.runtime.ray.config import RayRuntimeConfig
from core.types import RolloutRequest, RolloutResult, RolloutStatus

if TYPE_CHECKING:
    from omegaconf import DictConfig

logger = logging.getLogger("core.runtime.ray")

ACTOR_PREFIX = "tracerl-agent-"
"""Names of the agent actors start with this (then the runtime's id and the actor index)."""

_PASSED_TO_LOCAL = ("startup_timeout_s", *(f.name for f in dataclasses.fields(AgentServerSettings)))
"""Settings each actor's ``LocalRuntime`` gets from ``RayRuntimeConfig`` (shared by inheritance)."""

PROBE_FIRST_S = 0.5
"""First pause between ``ready`` probes of an actor Ray is recreating (doubles each time)."""
PROBE_MAX_S = 30.0
"""Longest pause between probes: a late actor is found again within this long."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"runtime=ray needs Ray: {RAY_INSTALL_HINT} on the trainer and on every node of "
            "the cluster"
        ) from exc
    check_ray_version(str(getattr(ray, "__version__", "")))
    return ray


@dataclass
class _Slot:
    """One agent actor as the driver tracks it."""

    index: int
    name: str
    handle: Any
    in_flight: int = 0
    healthy: bool = True
    """False from a failure until the actor answers ``ready`` again (Ray is recreating it)."""
    dead: bool = False
    """Ray gave up on it (restarts used up): no rollout goes there again."""
    node_id: str = ""


class RayRuntime(RuntimeBase):
    """Runs rollouts on agent actors in a Ray cluster.

    Example:
        >>> rt = RayRuntime("examples.math_agent.agent:app", address="auto", num_actors=4)
        >>> await rt.start()
        >>> result = await rt.run_rollout(request)
        >>> await rt.aclose()

    Args:
        agent: The agent app as ``module:attribute`` (importable on the nodes).
        config: Runtime settings; keyword ``overrides`` replace single fields.
        env: Extra environment variables for the agent processes.
        gateway_host: The host agents dial (``gateway.public_host`` or ``gateway.host``),
            checked at start against the cluster's node IPs.
        **overrides: Any ``RayRuntimeConfig`` field, e.g. ``num_actors=4``.

    Raises:
        ConfigError: ``agent`` is not ``module:attribute`` or a setting is out of range.
    """

    kind = "ray"

    def __init__(
        self,
        agent: str,
        *,
        config: RayRuntimeConfig | None = None,
        env: dict[str, str] | None = None,
        gateway_host: str = "",
        **overrides: Any,
    ) -> None:
        super().__init__()
        self.config = with_overrides(config or RayRuntimeConfig(), overrides, runtime="RayRuntime")
        check_agent_ref(agent)
        self._validate()
        self.agent = agent
        self.env = dict(env or {})
        self.gateway_host = gateway_host
        self.run_id = uuid.uuid4().hex[:8]
        self._ray: Any = None
        self._own_connection = False
        self._slots: list[_Slot] = []
        # Signalled when an actor gets room or changes health: a rollout waits here for a
        # live actor with fewer than agents_per_actor in flight, so that its timeout counts
        # from when an actor has room for it (as under runtime=local), not while it queues,
        # and the actor's spare concurrency stays free for cancel/ready/shutdown calls.
        self._room = asyncio.Condition()
        self.rollouts_per_node: Counter[str] = Counter()
        """Rollouts that came back from each node id (placement, for metrics and tests)."""
        self._reserved: dict[str, _Slot] = {}
        """Places taken by ``reserve`` for rollouts not yet run, by rollout id."""

    def _validate(self) -> None:
        c = self.config
        if c.num_actors < 1 or c.agents_per_actor < 1 or c.processes_per_actor < 1:
            raise ConfigError(
                "runtime.num_actors, runtime.agents_per_actor and runtime.processes_per_actor "
                f"must be >= 1, got {c.num_actors!r}, {c.agents_per_actor!r} and {c.processes_per_actor!r}"
            )
        amounts = {"num_cpus_per_agent": c.num_cpus_per_agent, "memory_per_agent_mb": c.memory_per_agent_mb}
        amounts.update({f"resources_per_agent.{k}": v for k, v in c.resources_per_agent.items()})
        for key, value in amounts.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"runtime.{key} must be a number >= 0, got {value!r}")
        if c.scheduling_strategy not in ("SPREAD", "DEFAULT"):
            raise ConfigError(
                f"runtime.scheduling_strategy must be 'SPREAD' or 'DEFAULT', got {c.scheduling_strategy!r}"
            )
        if c.result_channel not in ("http", "s3"):
            raise ConfigError(f"runtime.result_channel must be 'http' or 's3', got {c.result_channel!r}")
        if c.result_channel == "s3" and not c.s3_bucket:
            raise ConfigError("runtime.result_channel=s3 needs runtime.s3_bucket")

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RayRuntime:
        """Build from the composed config (``core.config.TrainConfig``): ``cfg.runtime``,
        ``cfg.task.agent``/``agent_env``, ``cfg.gateway``."""
        agent, env = agent_app(cfg)
        from omegaconf import OmegaConf

        values = node_values(cfg.runtime, RayRuntimeConfig)
        for key in ("resources_per_agent", "label_selector", "runtime_env"):
            if key in values and not isinstance(values[key], dict):
                values[key] = OmegaConf.to_container(values[key], resolve=True)
        from core.gateway.config import SHARDS_PER_NODE

        host = advertised_gateway_host(cfg)
        gateway = cfg.get("gateway") if hasattr(cfg, "get") else None
        if gateway is not None and gateway.get("shards") == SHARDS_PER_NODE:
            host = ""  # agents dial their own node's gateway shard (core.rollout.node_shards)
        return cls(agent, config=RayRuntimeConfig(**values), env=env, gateway_host=host)

    # -- lifecycle --------------------------------------------------------------------

    @property
    def actor_names(self) -> list[str]:
        """Names of this runtime's actors (in ``config.namespace``)."""
        return [s.name for s in self._slots]

    @property
    def actors(self) -> list[Any]:
        """The actor handles (for inspection and fault tests)."""
        return [s.handle for s in self._slots]

    @property
    def node_ids(self) -> list[str]:
        """The Ray node ids the actors run on (each once, in actor order)."""
        return list(dict.fromkeys(s.node_id for s in self._slots if s.node_id))

    def _connect(self) -> Any:
        ray = _import_ray()
        c = self.config
        if ray.is_initialized():
            return ray
        kwargs: dict[str, Any] = {
            "namespace": c.namespace,
            "logging_level": logging.WARNING,
            "log_to_driver": False,
        }
        if c.address:
            kwargs["address"] = c.address
        else:
            check_private_ray_auth(os.environ)
            kwargs["include_dashboard"] = False
            kwargs["dashboard_host"] = "127.0.0.1"  # should a dashboard start anyway
            if c.num_cpus:
                kwargs["num_cpus"] = c.num_cpus
            if c.object_store_memory_mb:
                kwargs["object_store_memory"] = int(c.object_store_memory_mb) * 2**20
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {c.address!r}" if c.address else "a local Ray"
            raise RuntimeStartError(
                f"could not connect to {where}: {exc}. Check runtime.address (auto, "
                "ray://head:10001 or host:6379), or leave it empty to start Ray here"
            ) from exc
        self._own_connection = True
        return ray

    def _actor_options(self, index: int) -> dict[str, Any]:
        c = self.config
        n = c.agents_per_actor
        options: dict[str, Any] = {
            "name": f"{ACTOR_PREFIX}{self.run_id}-{index}",
            "namespace": c.namespace,
            "num_cpus": c.num_cpus_per_agent * n,
            "max_restarts": c.max_actor_restarts,
            "max_task_retries": 0,  # a rollout is not idempotent: it fails, the trainer decides
            "max_concurrency": n + 16,  # run calls plus cancel/ready/shutdown
            "lifetime": None,
        }
        if c.memory_per_agent_mb:
            options["memory"] = int(c.memory_per_agent_mb * n * 2**20)
        if c.resources_per_agent:
            options["resources"] = {k: float(v) * n for k, v in c.resources_per_agent.items()}
        if c.label_selector:
            options["label_selector"] = {str(k): str(v) for k, v in c.label_selector.items()}
        if c.scheduling_strategy != "DEFAULT":
            options["scheduling_strategy"] = c.scheduling_strategy
        if c.runtime_env:
            options["runtime_env"] = dict(c.runtime_env)
        return options

    def _local_config(self) -> LocalRuntimeConfig:
        c = self.config
        values = {k: getattr(c, k) for k in _PASSED_TO_LOCAL}
        # Variables the operator gave the actors through Ray reach their agents too.
        env_vars = dict(c.runtime_env or {}).get("env_vars") or {}
        values["pass_env"] = [*(str(n) for n in values.get("pass_env") or ()), *map(str, env_vars)]
        return LocalRuntimeConfig(
            num_processes=c.processes_per_actor, max_concurrency=c.agents_per_actor, **values
        )

    async def _start(self) -> None:
        """Join (or start) Ray, check the gateway's address, create the actors and wait for them.

        Raises:
            ConfigError: Ray is missing, or the gateway is loopback while nodes are elsewhere.
            RuntimeStartError: Ray is unreachable, or an actor did not come up in
                ``startup_timeout_s`` (no node fits its resources/labels, or its agent
                servers failed; the message says which).
        """
        ray = self._ray = self._connect()
        try:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            check_gateway_reachable(
                self.gateway_host,
                node_ips=[str(n.get("NodeManagerAddress") or "") for n in alive],
                driver_ip=ray.util.get_node_ip_address(),
            )
            from core.runtime.ray._host import AgentHost

            cls = ray.remote(AgentHost)
            local = self._local_config()
            for i in range(self.config.num_actors):
                options = self._actor_options(i)
                handle = cls.options(**options).remote(self.agent, local, self.env)
                self._slots.append(_Slot(i, options["name"], handle))
            await self._wait_ready()
        except BaseException:
            await self._shutdown()
            raise

    async def _wait_ready(self) -> None:
        ray = self._ray
        timeout = self.config.startup_timeout_s
        refs = [s.handle.ready.remote() for s in self._slots]
        done, pending = await asyncio.wait(
            [asyncio.ensure_future(awaitable(r)) for r in refs], timeout=timeout
        )
        for fut in pending:
            fut.cancel()
        if pending:
            need = self._actor_options(0)
            raise RuntimeStartError(
                f"{len(pending)} of {len(refs)} agent actors were not ready within "
                f"runtime.startup_timeout_s={timeout:g}s. Each asks for "
                f"num_cpus={need['num_cpus']:g}, resources={need.get('resources', {})!r}, "
                f"label_selector={need.get('label_selector', {})!r}; the cluster has "
                f"{ray.available_resources()!r} available. Lower runtime.num_cpus_per_agent or "
                "runtime.agents_per_actor, fix the labels, or add nodes"
            )
        errors = [exc for fut in done if (exc := fut.exception()) is not None]
        if errors:
            raise RuntimeStartError(f"an agent actor failed to start: {_cause(errors[0])}")
        infos = [await awaitable(r) for r in refs]
        for slot, info in zip(self._slots, infos, strict=True):
            slot.node_id = str(info.get("node_id", ""))

    async def _shutdown(self) -> None:
        """Stop and kill every actor, leave Ray if we joined it."""
        self._cancel_background()
        ray = self._ray
        if ray is not None and self._slots:
            # Only actors that came up have agent servers to stop; one still waiting for a
            # node would hold the stop call until the timeout.
            started = [s for s in self._slots if s.node_id]
            await call_all([s.handle.shutdown.remote() for s in started], timeout_s=10.0)
            for slot in self._slots:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception as exc:  # already gone: nothing to leave behind
                    logger.debug("ray.kill(%s): %r", slot.name, exc)
        self._slots = []
        self._reserved.clear()
        if ray is not None and self._own_connection:
            ray.shutdown()
            self._own_connection = False

    # -- rollouts ---------------------------------------------------------------------

    def _pick(self, where: Callable[[str], bool] | None = None) -> _Slot | None:
        """The least busy actor with room (under ``agents_per_actor`` in flight), among the
        healthy ones while any is healthy, on a node ``where`` accepts; None while each is full."""
        live = [s for s in self._slots if not s.dead and (where is None or where(s.node_id))]
        pool = [s for s in live if s.healthy] or live
        free = [s for s in pool if s.in_flight < self.config.agents_per_actor]
        return min(free, key=lambda s: s.in_flight) if free else None

    async def _acquire(
        self, where: Callable[[str], bool] | None = None, wait_for: Callable[[str], bool] | None = None
    ) -> _Slot | None:
        """Wait for an actor with room (on a node ``where`` accepts) and take one of its places;
        None when all such actors are dead and no live actor is on a node ``wait_for`` says
        may be accepted later."""

        def possible(slot: _Slot) -> bool:
            if slot.dead:
                return False
            return where is None or where(slot.node_id) or (wait_for is not None and wait_for(slot.node_id))

        async with self._room:
            while any(possible(s) for s in self._slots):
                slot = self._pick(where)
                if slot is not None:
                    slot.in_flight += 1
                    return slot
                await self._room.wait()
            return None

    async def _release(self, slot: _Slot) -> None:
        slot.in_flight -= 1  # before any await: a second cancel cannot leak the place
        async with self._room:
            # notify_all, not notify: a single woken waiter that is cancelled at that moment
            # would take the wake-up with it, and another waiting rollout would sit until the
            # next release (forever, if this was the last one in flight).
            self._room.notify_all()

    async def _health_changed(self) -> None:
        """Wake every waiting rollout: the set of actors they may use changed."""
        async with self._room:
            self._room.notify_all()

    # -- placement before the run (gateway.shards=per_node) -------------------------------

    async def reserve(
        self, rollout_id: str, where: Callable[[str], bool], *, wait_for: Callable[[str], bool] | None = None
    ) -> str | None:
        """Take a place for ``rollout_id`` on the least busy actor whose node ``where`` accepts
        (waiting for room), so that its gateway session can be opened on that node first.

        Its ``run_rollout`` then runs on that actor; a rollout that will not run must be
        ``unreserve``d. ``wait_for``: nodes not accepted yet that may be soon (a gateway shard
        starting there); while a live actor is on one, the rollout waits (``placement_changed``
        wakes it). Returns the actor's node id; None when no live actor's node is accepted or
        awaited, or the runtime is not running.
        """
        if not self._started or self._closed:
            return None
        slot = await self._acquire(where, wait_for)
        if slot is None:
            return None
        self._reserved[rollout_id] = slot
        return slot.node_id

    async def unreserve(self, rollout_id: str) -> None:
        """Give back the place ``reserve`` took for a rollout that will not run; idempotent."""
        slot = self._reserved.pop(rollout_id, None)
        if slot is not None:
            await self._release(slot)

    async def placement_changed(self) -> None:
        """Let rollouts waiting in ``reserve`` look again (a node's ``where`` answer changed)."""
        await self._health_changed()

    async def _run(self, request: RolloutRequest, clock: RolloutClock) -> RolloutResult:
        """One rollout on the least busy actor with room; never raises for agent, actor or node faults."""
        rid = request.rollout_id
        slot = self._reserved.pop(rid, None) or await self._acquire()
        clock.restart()  # queueing for a slot is not the rollout's time
        if slot is None:
            return failed(
                rid,
                RolloutStatus.CRASHED,
                "no agent actor is left: Ray recreated each one runtime.max_actor_restarts="
                f"{self.config.max_actor_restarts} times; see the Ray logs on the nodes",
                0.0,
            )
        try:
            ref = slot.handle.run.remote(request)
            try:
                async with asyncio.timeout(request.timeout_s + self.config.call_grace_s):
                    result, node_id = await awaitable(ref)
            except TimeoutError:
                self._forward_cancel(slot, rid)
                try:
                    self._ray.cancel(ref)
                except Exception as exc:  # already finished or its actor is gone
                    logger.debug("ray.cancel(%s): %r", rid, exc)
                return failed(
                    rid,
                    RolloutStatus.TIMEOUT,
                    f"agent actor {slot.index} did not answer within the rollout's "
                    f"{request.timeout_s:g}s timeout plus runtime.call_grace_s="
                    f"{self.config.call_grace_s:g}s",
                    clock.elapsed(),
                )
            except asyncio.CancelledError:
                if self._cancelled_by_us(rid):
                    self._forward_cancel(slot, rid)
                raise
            except Exception as exc:
                return self._actor_failure(slot, rid, exc, clock)
            if not isinstance(result, RolloutResult):  # a mismatched tracerl on the node
                return failed(
                    rid,
                    RolloutStatus.CRASHED,
                    f"agent actor {slot.index} answered {type(result).__name__}, not a RolloutResult; "
                    "install the same tracerl version on the trainer and the nodes",
                    clock.elapsed(),
                )
            self.rollouts_per_node[str(node_id)] += 1
            return dataclasses.replace(result, elapsed_s=clock.elapsed())
        finally:
            await self._release(slot)

    def _forward_cancel(self, slot: _Slot, rollout_id: str) -> None:
        try:
            slot.handle.cancel.remote(rollout_id)
        except Exception as exc:  # the actor is gone: nothing runs there to stop
            logger.debug("cancel on %s: %r", slot.name, exc)

    def _actor_failure(
        self, slot: _Slot, rid: str, exc: Exception, clock: RolloutClock
    ) -> RolloutResult:
        """A failed result for a rollout whose actor (or its node) failed; watch the actor."""
        ray = self._ray
        errors = ray.exceptions
        elapsed = clock.elapsed()
        where = f"agent actor {slot.index} ({slot.name}, node {slot.node_id[:12] or '?'})"
        if isinstance(exc, errors.RayActorError):
            self._forward_cancel(slot, rid)  # merely unreachable: the rollout may still run there
            slot.healthy = False
            self._watch(slot)
            what = f"{where} died or became unreachable mid-rollout (its process or node was lost)"
            return failed(rid, RolloutStatus.CRASHED, f"{what}; Ray recreates it. {_cause(exc)}", elapsed)
        if isinstance(exc, errors.TaskCancelledError):
            return failed(rid, RolloutStatus.CRASHED, f"{where} cancelled the rollout", elapsed)
        if isinstance(exc, errors.RayTaskError):
            return failed(rid, RolloutStatus.CRASHED, f"{where} failed: {_cause(exc)}", elapsed)
        if isinstance(exc, errors.RayError):
            slot.healthy = False
            self._watch(slot)
            return failed(rid, RolloutStatus.CRASHED, f"{where}: Ray failed the call: {_cause(exc)}", elapsed)
        raise exc

    def _watch(self, slot: _Slot) -> None:
        """Wait in the background until Ray has recreated ``slot`` (or gave up on it)."""
        name = f"watch-{slot.index}"
        if self._closed or self._background_running(name):
            return
        self._in_background(self._probe(slot), name)

    async def _probe(self, slot: _Slot) -> None:
        """Ask ``slot`` for ``ready`` until it answers (healthy again), Ray drops it (dead) or
        the runtime closes; pauses grow from ``PROBE_FIRST_S`` to ``PROBE_MAX_S``, so an actor
        that comes back late (a node that took long to join) is used again."""
        errors = self._ray.exceptions
        pause = PROBE_FIRST_S
        while not self._closed:
            try:
                async with asyncio.timeout(self.config.startup_timeout_s):
                    info = await awaitable(slot.handle.ready.remote())
            except errors.ActorDiedError as exc:
                if not self._still_registered(slot):
                    slot.dead = True
                    logger.warning("%s is dead and will not be recreated: %s", slot.name, _cause(exc))
                    await self._health_changed()
                    return
                logger.info("%s died again; Ray recreates it once more", slot.name)
            except (TimeoutError, errors.RayError) as exc:
                logger.info("%s not ready yet: %s", slot.name, _cause(exc))
            else:
                slot.node_id = str(info.get("node_id", ""))
                slot.healthy = True
                logger.warning("%s is back on node %s", slot.name, slot.node_id[:12])
                await self._health_changed()
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, PROBE_MAX_S)

    def _still_registered(self, slot: _Slot) -> bool:
        """True while Ray still knows the named actor (a permanently dead one is dropped)."""
        try:
            self._ray.get_actor(slot.name, namespace=self.config.namespace)
        except ValueError:
            return False
        return True


def _cause(exc: BaseException) -> str:
    """The first lines of a Ray error (its tracebacks run to pages)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    short = " ".join(lines[:3])
    if len(lines) > 3:
        short += f" ... {lines[-1].strip()}"
    return f"{type(exc).__name__}: {short[:800]}"

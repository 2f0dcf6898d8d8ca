"""One gateway shard on each Ray node, next to the agents that call it (``gateway.shards=per_node``).

With ``runtime=ray`` the agents run in actors spread over the cluster's nodes. Rather
than every agent calling gateway processes on the trainer's machine, each node that
hosts agent actors gets its own gateway shard, and each rollout's session is opened on
the shard of the node its agent runs on: the agent's base URL names its node's shard,
and its model calls never leave the node. Defines:

- ``ShardHost``: the Ray actor (a plain class; ``ray.remote`` wraps it) that runs one
  ``python -m core.gateway shard`` process on its node, exactly the process
  ``gateway.shards=N`` runs on the trainer's machine; Ray pins it to the node
  (``NodeAffinitySchedulingStrategy``). The trainer's tokenizer travels with it.
- ``NodeShards``: the trainer side, a ``GatewayShards`` whose shards live on Ray nodes.
  It asks the ray runtime for each rollout's place first (``RayRuntime.reserve``: the
  least busy agent actor on a node whose shard is alive), opens the session on that
  node's shard, and the runtime then runs the rollout on that actor. Harvest, stats and
  weight versions are ``GatewayShards``' own, over HTTP to each shard. A shard whose
  process exits, or whose actor or node is lost, fails only that node's rollouts
  (``ShardLost`` naming the shard, its node and why); new rollouts go to the nodes whose
  shard is alive. A node that gets agent actors after the start (an actor Ray recreated
  there, a node an autoscaler added) gets its shard when the runtime first looks there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, RuntimeStartError
from core.rollout.sessions import ShardLost
from core.rollout.shards import (
    START_TIMEOUT_S,
    GatewayShards,
    Shard,
    ShardSpec,
    _await_listening,
    _child_env,
    _Shard,
    _stop,
)
from core.runtime.ray.calls import awaitable, call_all
from core.types import SamplingParams

if TYPE_CHECKING:
    from core.runtime.ray.runtime import RayRuntime

__all__ = ["SHARD_ACTOR_PREFIX", "NodeShards", "ShardHost"]

logger = logging.getLogger("core.rollout.node_shards")

SHARD_ACTOR_PREFIX = "tracerl-shard-"
"""Names of the shard actors start with this (then the runtime's id and the shard index)."""
LATE_RETRY_S = 60.0
"""How long after a late shard's failed start its node may be tried again."""


_TOKENIZER_FOLDERS = ("tokenizer", "tokenizer-split")
"""Where a ``ShardHost`` writes the trainer's whole tokenizer save and its split copy."""


def _tokenizer_files(spec: ShardSpec) -> dict[str, bytes]:
    """The spec's tokenizer files as ``ShardHost`` takes them: ``FOLDER/NAME`` -> bytes."""
    dirs = (spec.tokenizer_dir, spec.tokenizer_split_dir)
    return {
        f"{folder}/{p.name}": p.read_bytes()
        for folder, where in zip(_TOKENIZER_FOLDERS, dirs, strict=True) if where
        for p in sorted(Path(where).iterdir()) if p.is_file()
    }


class ShardHost:
    """One Ray actor: the gateway shard process of its node.

    Args:
        index: The shard's index (its name in messages).
        spec: ``ShardSpec`` fields as the trainer wrote them.
        tokenizer_files: The trainer's saved tokenizer, ``tokenizer/NAME`` (the whole save)
            and ``tokenizer-split/NAME`` (its split copy, when it has one) -> bytes (the
            trainer's disk is not this node's; ``_tokenizer_files``).
    """

    def __init__(self, index: int, spec: dict[str, Any], tokenizer_files: dict[str, bytes]) -> None:
        self._index = index
        self._spec = spec
        self._files = tokenizer_files
        self._shard: _Shard | None = None
        self._folder = ""

    async def start(self, timeout_s: float) -> dict[str, Any]:
        """Start the shard process, bound to this node's IP, and say where it listens.

        Raises:
            RuntimeStartError: it exited or did not listen within ``timeout_s``.
        """
        import ray

        odd = [n for n in self._files if n.partition("/")[0] not in _TOKENIZER_FOLDERS or n.count("/") != 1]
        if odd:
            raise ValueError(f"gateway shard: tokenizer files from the trainer outside {_TOKENIZER_FOLDERS}: {odd}")
        self._folder = tempfile.mkdtemp(prefix="tracerl-node-shard-")
        for name, data in self._files.items():
            (Path(self._folder) / name).parent.mkdir(exist_ok=True)
            (Path(self._folder) / name).write_bytes(data)
        split = Path(self._folder) / _TOKENIZER_FOLDERS[1]
        node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        spec = {
            **self._spec,
            "tokenizer_dir": str(Path(self._folder) / _TOKENIZER_FOLDERS[0]),
            "tokenizer_split_dir": str(split) if split.is_dir() else "",
            "gateway": {**self._spec["gateway"], "host": node_ip},
            "public_host": "",
        }
        path = Path(self._folder) / "spec.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        path.chmod(0o600)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "core.gateway", "shard", str(path), "--port", "0",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None, env=_child_env(),
        )
        self._shard = _Shard(index=self._index, proc=proc)
        try:
            await _await_listening(self._shard, timeout_s)
        finally:
            # A listening shard has read its spec and tokenizer: nothing is left behind on
            # the node however this actor ends, and the admin token is on disk no longer.
            shutil.rmtree(self._folder, ignore_errors=True)
        return {
            "root_url": self._shard.root_url,
            "pid": proc.pid,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def wait_exit(self) -> int:
        """Return the shard process's exit code once it exits."""
        assert self._shard is not None
        return int(await self._shard.proc.wait())

    async def stop(self) -> None:
        """Stop the shard process (stdin closed, then SIGTERM, then SIGKILL)."""
        if self._shard is not None:
            await _stop(self._shard)


@dataclass
class _NodeShard:
    """A shard on a Ray node as the trainer tracks it (a ``core.rollout.shards.Shard``)."""

    index: int
    handle: Any
    node_id: str
    root_url: str = ""
    pid: int = 0
    exit_code: int | None = None
    """The shard process's exit code once it exited."""
    lost: str = ""
    """Why its actor is gone (the actor or its node was lost), once it is."""

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    @property
    def alive(self) -> bool:
        return self.exit_code is None and not self.lost

    def name(self) -> str:
        return f"gateway shard {self.index} on Ray node {self.node_id[:12]} ({self.root_url}, pid {self.pid})"

    def gone(self, what: str) -> ShardLost:
        if self.exit_code is not None:
            what = f"its process exited with code {self.exit_code}"
        elif self.lost:
            what = self.lost
        return ShardLost(f"{self.name()}: {what}")


@dataclass
class _Launch:
    """What starting this run's shard actors takes: the spec, the tokenizer, the runtime."""

    spec: dict[str, Any]
    """``ShardSpec`` fields as the trainer wrote them (``ShardHost`` rewrites the node's paths)."""
    files: dict[str, bytes]
    """The trainer's tokenizer files (``_tokenizer_files``), sent to each shard actor."""
    runtime: RayRuntime
    """The ray runtime whose agent actors the shards serve (its run id names the actors)."""
    timeout_s: float
    """How long a shard process may take to listen."""

    async def start(self, nodes: list[str], *, first_index: int) -> list[_NodeShard]:
        """A shard actor pinned to each of ``nodes``, started and listening.

        Raises:
            RuntimeStartError: a shard did not come up (its error, or its node, is named).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        runtime = self.runtime
        remote = ray.remote(ShardHost)
        handles: list[Any] = []
        for i, node in enumerate(nodes, start=first_index):
            options: dict[str, Any] = {
                "name": f"{SHARD_ACTOR_PREFIX}{runtime.run_id}-{i}",
                "namespace": runtime.config.namespace,
                "num_cpus": 0,  # the shard's CPU is the agents' (per node: docs/scale.md)
                "max_restarts": 0,  # a lost shard's sessions are gone; its node's rollouts fail
                "max_task_retries": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            }
            if runtime.config.runtime_env:
                options["runtime_env"] = dict(runtime.config.runtime_env)
            handles.append(remote.options(**options).remote(i, self.spec, self.files))
        try:
            async with asyncio.timeout(self.timeout_s + 30):
                infos = await asyncio.gather(*(awaitable(h.start.remote(self.timeout_s)) for h in handles))
        except BaseException as exc:
            for h in handles:
                with contextlib.suppress(Exception):
                    ray.kill(h, no_restart=True)
            if isinstance(exc, TimeoutError | ray.exceptions.RayError):
                raise RuntimeStartError(
                    f"gateway.shards=per_node: a gateway shard on a Ray node did not start: {_cause(exc)}"
                ) from None
            raise
        return [
            _NodeShard(i, h, node, root_url=str(info["root_url"]), pid=int(info["pid"]))
            for i, (h, node, info) in enumerate(zip(handles, nodes, infos, strict=True), start=first_index)
        ]


class NodeShards(GatewayShards):
    """A gateway shard on each node of the ray runtime's agent actors; a ``SessionHost``.

    Use ``NodeShards.start_on_nodes``.
    """

    def __init__(self, shards: list[_NodeShard], admin_token: str, runtime: RayRuntime) -> None:
        super().__init__(shards, admin_token, "")
        self.runtime = runtime
        self.node_shards = shards
        self._by_node = {s.node_id: s for s in shards}
        self._watchers: list[asyncio.Task[None]] = []
        self._launch: _Launch | None = None
        """How this run's shards start (``start_on_nodes`` sets it), for nodes added later."""
        self._late: dict[str, asyncio.Task[None]] = {}
        """Shards started after the run's start, by node (running, done, or failed and
        waiting ``LATE_RETRY_S`` before the node may be tried again)."""
        self._starting: set[str] = set()
        """Nodes whose late shard is starting now."""
        self._indexes = len(shards)
        """Shard indexes given out (each names its actor), late starts included."""
        self.sessions_per_node: Counter[str] = Counter()
        """Sessions opened on each node's shard (by Ray node id)."""

    @classmethod
    async def start_on_nodes(
        cls, spec: ShardSpec, runtime: RayRuntime, *, timeout_s: float = START_TIMEOUT_S
    ) -> NodeShards:
        """Start one shard on each node that hosts ``runtime``'s agent actors (started already).

        A node that gets agent actors later (Ray recreated one elsewhere, or an autoscaler
        added the node) gets its shard when the runtime first looks for a place there
        (``_hosts``); until it listens and knows the fleet, that node takes no rollouts.

        Raises:
            RuntimeStartError: a shard did not come up (its error, or its node, is named).
        """
        nodes = runtime.node_ids
        if not nodes:
            raise RuntimeStartError("gateway.shards=per_node: the ray runtime has no agent actor placed on a node yet")
        launch = _Launch(dataclasses.asdict(spec), _tokenizer_files(spec), runtime, timeout_s)
        shards = await launch.start(nodes, first_index=0)
        self = cls(shards, str(spec.gateway["admin_token"]), runtime)
        self._launch = launch
        for shard in shards:
            self._watchers.append(asyncio.create_task(self._watch(shard), name=f"watch-shard-{shard.index}"))
        return self

    def shard_on(self, node_id: str) -> _NodeShard:
        """The shard of Ray node ``node_id``."""
        return self._by_node[node_id]

    def _hosts(self, node_id: str) -> bool:
        """True when ``node_id`` has a live shard (the runtime places rollouts only there).

        A node that never had a shard gets one started in the background (``_starting`` until
        it can take rollouts); a node whose shard died keeps none (its sessions were lost with
        it; docs/scale.md)."""
        shard = self._by_node.get(node_id)
        if shard is None and node_id and self._launch is not None and node_id not in self._late:
            self._indexes += 1
            self._starting.add(node_id)
            self._late[node_id] = asyncio.get_running_loop().create_task(
                self._start_late(node_id, self._indexes - 1), name=f"start-shard-{node_id[:12]}"
            )
        return shard is not None and shard.alive

    def _is_starting(self, node_id: str) -> bool:
        """True while ``node_id``'s late shard is starting: rollouts may wait for it."""
        return node_id in self._starting

    async def _start_late(self, node_id: str, index: int) -> None:
        """Start the shard of a node that got agent actors after the start, tell it what the
        other shards know of the fleet, then let the runtime place rollouts there. A start
        that fails is logged, and tried again ``LATE_RETRY_S`` later (when the runtime next
        looks at the node)."""
        try:
            started = await self._bring_up(node_id, index)
        except Exception as exc:  # a bug, or Ray refusing the actor: that node takes no rollouts
            logger.error("gateway.shards=per_node: starting a gateway shard on node %s failed: %s",
                         node_id[:12], _cause(exc), exc_info=exc)
            started = False
        self._starting.discard(node_id)
        await self.runtime.placement_changed()  # rollouts waiting for this node look again
        if not started:
            await asyncio.sleep(LATE_RETRY_S)
            self._late.pop(node_id, None)

    async def _bring_up(self, node_id: str, index: int) -> bool:
        """``_start_late``'s work; True once the node's shard takes rollouts."""
        launch = self._launch
        if launch is None:
            return False  # closed meanwhile
        try:
            (shard,) = await launch.start([node_id], first_index=index)
        except RuntimeStartError as exc:
            logger.warning("gateway.shards=per_node: %s; the agent actors on node %s take no rollouts "
                           "until a start succeeds", exc, node_id[:12])
            return False
        self.shards.append(shard)  # from here on holds and releases reach it too
        self.node_shards.append(shard)
        self._watchers.append(asyncio.create_task(self._watch(shard), name=f"watch-shard-{shard.index}"))
        await self.catch_up(shard)
        if not shard.alive:
            return False
        self._by_node[node_id] = shard
        logger.info("%s started: its node got agent actors after the run started", shard.name())
        return True

    async def open(self, sampling: SamplingParams, metadata: dict[str, Any]) -> tuple[str, str]:
        """Take the rollout's place on an agent actor first, then open its session on that
        actor's node's shard; its id and base URL.

        Raises:
            ShardLost: no agent actor is left on a node whose shard is alive, or the chosen
                node's shard died meanwhile.
        """
        rollout_id = str(metadata.get("rollout_id") or "")
        if not rollout_id:
            raise ConfigError("gateway.shards=per_node opens a session per rollout: metadata needs its rollout_id")
        node = await self.runtime.reserve(rollout_id, self._hosts, wait_for=self._is_starting)
        if node is None:
            dead = "; ".join(str(s.gone("")) for s in self.node_shards if not s.alive)
            raise ShardLost(
                "no agent actor of the ray runtime runs on a node whose gateway shard is alive"
                + (f" ({dead})" if dead else "")
            )
        try:
            sid, base_url = await self._open_on(self._by_node[node], sampling, metadata)
        except BaseException:
            await self.runtime.unreserve(rollout_id)
            raise
        self.sessions_per_node[node] += 1
        return sid, base_url

    async def _watch(self, shard: _NodeShard) -> None:
        """Learn when ``shard``'s process exits or its actor (or node) is lost."""
        try:
            shard.exit_code = int(await awaitable(shard.handle.wait_exit.remote()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # RayActorError: the actor, its worker or its node died
            shard.lost = shard.lost or f"its Ray actor or node was lost ({_cause(exc)})"
        logger.warning("%s; its node's rollouts fail, new ones go to other nodes", shard.gone(""))
        await self.runtime.placement_changed()

    async def _kill(self, shard: Shard, lost: str) -> None:
        """Stop a shard that failed to follow a weight push: its actor is killed."""
        import ray

        assert isinstance(shard, _NodeShard)
        shard.lost = lost
        with contextlib.suppress(Exception):
            ray.kill(shard.handle, no_restart=True)

    async def aclose(self) -> None:
        """Stop every shard and its actor; idempotent."""
        self._launch = None  # no late shard starts from here on
        for task in [*self._watchers, *self._late.values()]:
            task.cancel()
        self._watchers = []
        self._stop_tasks()
        await self._http.aclose()
        import ray

        if not ray.is_initialized():
            return  # the runtime left Ray: the actors went with this driver, their shards with them
        await call_all([s.handle.stop.remote() for s in self.node_shards if not s.lost], timeout_s=15.0)
        for shard in self.node_shards:
            with contextlib.suppress(Exception):
                ray.kill(shard.handle, no_restart=True)


def _cause(exc: BaseException) -> str:
    """An error's first and last lines (Ray's tracebacks run to pages; the cause is last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    short = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {short[:600]}"

"""The gateway in N processes: sessions spread over shards, harvested as from one gateway.

Sessions are independent, so the gateway scales by session (``gateway.shards``,
docs/scale.md). Defines:

- ``ShardSpec``: everything a shard process needs to build the same gateway as the
  trainer's: the tokenizer (saved whole and, for a BPE model, in pieces with the digest
  of its backend, which the shard loads without ``from_pretrained``'s peak memory the way
  the gateway CLI does, ``core.tokenizer_export``; with its fingerprint, so a shard that
  would render other tokens refuses to start), end-of-turn ids, the ``gateway`` settings, the
  policies and the sampler every shard calls (an HTTP fleet, or a scripted model for
  trying agents and benchmarks). ``shard_spec`` writes one from an in-process gateway.
- ``build_shard_gateway``: the shard side (``python -m core.gateway shard SPEC``).
- ``GatewayShards``: the trainer side, a ``core.rollout.sessions.SessionHost``: starts
  the shard processes (plain subprocesses on this machine), opens each session on the
  next live shard and gives its agent that shard's base URL, harvests a session from
  its shard over ``POST /admin/sessions/{sid}/harvest`` (exactly the rows, counters
  and conversation an in-process gateway gives), sums ``/admin/stats``, follows each
  weight push (``core.samplers.weights.PushFollower``: every shard holds, acknowledged,
  before a push that aborts, and learns the version and servers when it ends), and
  stops them. A shard that died fails only the rollouts it held, with ``ShardLost``
  naming it; new sessions go to the shards still alive. A shard that does not
  acknowledge a hold within ``HOLD_TIMEOUT_S`` is stopped and counts as dead: it must
  not sample unheld while the servers change weights.

A shard exits when its stdin closes, so the shards never outlive a trainer killed
without a chance to stop them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core.errors import ConfigError, RuntimeStartError
from core.gateway.config import GatewayConfig
from core.gateway.harvest import Harvest, harvest_from_json
from core.gateway.late_rewards import LateRewards, ShardLateRewards
from core.rollout.sessions import ShardLost
from core.rollout.shard_rewards import RewardCollector
from core.types import SamplingParams

__all__ = ["GatewayShards", "Shard", "ShardLateRewards", "ShardSpec", "build_shard_gateway", "read_spec", "shard_spec"]

START_TIMEOUT_S = 120.0
"""How long a shard process may take to print where it listens."""
HOLD_TIMEOUT_S = 30.0
"""How long a shard may take to acknowledge a hold (or a release) at a weight push."""
VIEW_INTERVAL_S = 1.0
"""How often the trainer checks whether the servers it routes to changed (``follow``)."""


@dataclass
class ShardSpec:
    """What every shard process builds its gateway from (written as JSON, mode 0600)."""

    tokenizer_dir: str
    """The trainer's tokenizer, saved with ``save_pretrained`` (what a shard loads when
    ``tokenizer_split_dir`` is empty or its copy differs)."""
    fingerprint: dict[str, Any]
    """``core.tokenizer_export.fingerprint`` of the trainer's tokenizer; a shard whose
    copy differs refuses to start."""
    end_of_turn_ids: list[int]
    """The trainer's gateway's end-of-turn ids (the sampler's included)."""
    model_id: str
    """Name agents pass as ``model``."""
    gateway: dict[str, Any]
    """``GatewayConfig`` fields; ``admin_token`` is the one every shard shares."""
    sampler: dict[str, Any]
    """``{"kind": "vllm"|"sglang", ...HttpSamplerConfig fields}``, or ``{"kind": "scripted",
    "reply": text, "delay_s": seconds}`` (``python -m core.gateway``'s scripted model)."""
    policies: dict[str, Any] = field(default_factory=dict)
    """``PolicyRoutes`` as ``{"names": [...], "models": {...}}``; empty: the default policy."""
    public_host: str = ""
    """Address agents dial, when it differs from ``gateway.host``."""
    tokenizer_split_dir: str = ""
    """The same tokenizer saved by ``core.tokenizer_export.save_copy`` (vocabulary, merges and
    pipeline, no ``tokenizer.json``), which the shard loads with ``load_checked_copy`` as the
    gateway CLI does; '' when it does not split (not a BPE model)."""
    tokenizer_digest: str = ""
    """sha256 of the trainer's backend's serialization: a split copy that rebuilds to another,
    or renders differently, makes the shard load ``tokenizer_dir`` instead, with a warning."""


def shard_spec(gateway: Any, sampler: dict[str, Any], folder: Path, *, public_host: str = "") -> ShardSpec:
    """The spec of shards serving what ``gateway`` (in this process) serves, sampling with
    ``sampler``; the tokenizer is saved under ``folder``.

    Raises:
        ConfigError: ``gateway`` serves several policies (a shard has one sampler).
    """
    from core.tokenizer_export import fingerprint, save_copy

    policies = gateway.policies
    if len(policies.names) > 1:
        raise ConfigError(
            f"gateway.shards above 1 serves one policy, but policies configures {list(policies.names)}: each "
            "policy samples with its own weights, and a shard has one sampler. Use gateway.shards=1 with "
            "several policies (docs/scale.md)"
        )
    tokenizer = gateway.renderer.tokenizer
    tok_dir = folder / "tokenizer"
    tokenizer.save_pretrained(str(tok_dir))
    split_dir = folder / "tokenizer-split"
    digest = save_copy(tokenizer, str(split_dir))
    if digest is None:  # not split: it would be tok_dir again
        shutil.rmtree(split_dir)
    config = dataclasses.asdict(gateway.config)
    config["admin_token"] = gateway.admin_token
    return ShardSpec(
        tokenizer_dir=str(tok_dir),
        fingerprint=json.loads(json.dumps(fingerprint(tokenizer))),
        end_of_turn_ids=[int(i) for i in gateway.end_of_turn_ids],
        model_id=str(gateway.model_id),
        gateway=config,
        sampler=dict(sampler),
        policies={"names": list(policies.names), "models": dict(policies.models)},
        public_host=public_host,
        tokenizer_split_dir=str(split_dir) if digest is not None else "",
        tokenizer_digest=digest or "",
    )


def read_spec(path: str | Path) -> ShardSpec:
    """The ``ShardSpec`` written at ``path``."""
    return ShardSpec(**json.loads(Path(path).read_text(encoding="utf-8")))


def build_shard_gateway(spec: ShardSpec) -> Any:
    """The shard's ``Gateway``: same tokenizer, settings and policies as the trainer's.

    Raises:
        ConfigError: the tokenizer copy renders differently (names the probe), or the
            sampler kind is unknown.
    """
    from core.gateway import Gateway
    from core.gateway.policies import PolicyRoutes
    from core.tokenizer_export import fingerprint

    tokenizer = _shard_tokenizer(spec)
    mine = json.loads(json.dumps(fingerprint(tokenizer)))
    differ = sorted(k for k in set(mine) | set(spec.fingerprint) if mine.get(k) != spec.fingerprint.get(k))
    if differ:
        raise ConfigError(
            f"gateway shard: the trainer's tokenizer saved at {spec.tokenizer_dir} reloads differently "
            f"(probe {differ[0]!r}); shards need a tokenizer transformers' fast class reproduces, "
            "use gateway.shards=1 with this one"
        )
    policies = PolicyRoutes(
        names=tuple(spec.policies.get("names") or ()) or PolicyRoutes().names,
        models=dict(spec.policies.get("models") or {}),
    )
    gateway = Gateway(
        tokenizer=tokenizer,
        sampler=_sampler(spec.sampler, tokenizer),
        config=GatewayConfig(**{**spec.gateway, "shards": 1}),
        model_id=spec.model_id,
        generation_config={"eos_token_id": list(spec.end_of_turn_ids)},
        policies=policies,
    )
    gateway.late_rewards = ShardLateRewards()
    return gateway


def _shard_tokenizer(spec: ShardSpec) -> Any:
    """The trainer's tokenizer: its split copy when it rebuilds the trainer's backend and
    fingerprint (``core.tokenizer_export.load_checked_copy``, as the gateway CLI loads), else
    the whole save with ``from_pretrained``, after a warning naming what differed."""

    def whole() -> Any:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(spec.tokenizer_dir)

    if not spec.tokenizer_split_dir:
        return whole()
    from core.tokenizer_export import load_checked_copy

    return load_checked_copy(
        spec.tokenizer_split_dir, spec.fingerprint, digest=spec.tokenizer_digest or None,
        name=f"of model {spec.model_id!r} in this gateway shard", fallback=whole,
        fallback_name=f"from_pretrained({spec.tokenizer_dir!r})",
    )


def _sampler(conf: dict[str, Any], tokenizer: Any) -> Any:
    kind = conf.get("kind")
    if kind == "scripted":
        from core.samplers import ScriptedSampler, encode_reply

        return ScriptedSampler(
            default=encode_reply(tokenizer, str(conf.get("reply", "Hello."))),
            tokenizer=tokenizer,
            record_calls=False,
            delay_s=conf.get("delay_s", 0.0) if not isinstance(conf.get("delay_s"), list) else tuple(conf["delay_s"]),
        )
    if kind in ("vllm", "sglang"):
        from core.samplers import build_http_sampler

        return build_http_sampler(conf)
    raise ConfigError(f"gateway shard: sampler kind must be 'vllm', 'sglang' or 'scripted', got {kind!r}")


class Shard(Protocol):
    """One gateway shard as ``GatewayShards`` drives it: a process on this machine, or one on
    a Ray node (``core.rollout.node_shards``)."""

    index: int
    root_url: str

    @property
    def base_url(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    def name(self) -> str: ...

    def gone(self, what: str) -> ShardLost: ...


@dataclass
class _Shard:
    index: int
    proc: asyncio.subprocess.Process
    root_url: str = ""
    lost: str = ""
    """Why the trainer stopped it (it failed to follow a weight push); '' otherwise."""

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def name(self) -> str:
        return f"gateway shard {self.index} ({self.root_url or 'not started'}, pid {self.proc.pid})"

    def gone(self, what: str) -> ShardLost:
        if self.lost:
            what = self.lost
        elif self.proc.returncode is not None:
            what = f"its process exited with code {self.proc.returncode}"
        return ShardLost(f"{self.name()}: {what}")


class GatewayShards:
    """N gateway processes on this machine; a ``SessionHost`` for ``RolloutRunner``."""

    late_rewards: LateRewards | None = None
    """The trainer's late-reward book the runner waits on (``collect_late_rewards``); None:
    ``reward_pending`` rollouts stay so."""

    def __init__(self, shards: Sequence[Shard], admin_token: str, folder: str) -> None:
        """Use ``GatewayShards.start``."""
        import httpx

        self.shards: list[Shard] = list(shards)
        self.hold_timeout_s = HOLD_TIMEOUT_S
        """How long a shard may take to acknowledge a hold, release or version."""
        self._fleet: Any = None
        """The trainer's HTTP sampler, once ``follow`` was called."""
        self._fleet_task: asyncio.Task[None] | None = None
        self._rewards_task: asyncio.Task[None] | None = None
        self._fleet_state: dict[str, Any] = {}
        """What the shards were last told of the fleet (version, retired, serving), for a
        shard that starts later (``catch_up``)."""
        self._held: int | None = None
        """The version of the weight push the shards are held for; None when not held."""
        self._sampler_lock = asyncio.Lock()
        """Orders what the shards are told of the fleet, so a late shard's ``catch_up`` never
        overtakes a newer message."""
        self._folder = folder
        self._owner: dict[str, Shard] = {}
        self._next = 0
        self._http = httpx.AsyncClient(
            headers={"authorization": f"Bearer {admin_token}"},
            timeout=httpx.Timeout(60.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    @classmethod
    async def start(cls, spec: ShardSpec, count: int, *, timeout_s: float = START_TIMEOUT_S) -> GatewayShards:
        """Start ``count`` shard processes from ``spec``; returns once each listens.

        Raises:
            RuntimeStartError: a shard exited or did not listen within ``timeout_s``
                (its last stderr lines are in the message).
        """
        if count < 1:
            raise ConfigError(f"gateway.shards must be >= 1, got {count!r}")
        folder = tempfile.mkdtemp(prefix="tracerl-shards-")
        path = Path(folder) / "spec.json"
        path.write_text(json.dumps(dataclasses.asdict(spec)), encoding="utf-8")
        path.chmod(0o600)
        base_port = int(spec.gateway.get("port") or 0)
        shards: list[_Shard] = []
        try:
            for i in range(count):
                port = base_port + i if base_port else 0
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "core.gateway", "shard", str(path), "--port", str(port),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None,
                    env=_child_env(),
                )
                shards.append(_Shard(index=i, proc=proc))
            await asyncio.gather(*(_await_listening(s, timeout_s) for s in shards))
        except BaseException:
            for s in shards:
                await _stop(s)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(shards, str(spec.gateway["admin_token"]), folder)

    @property
    def base_urls(self) -> list[str]:
        """Each shard's OpenAI-style base URL, by shard index."""
        return [s.base_url for s in self.shards]

    def shard_of(self, sid: str) -> int:
        """Index of the shard that holds session ``sid``."""
        return self._owner[sid].index

    async def open(self, sampling: SamplingParams, metadata: dict[str, Any]) -> tuple[str, str]:
        """Open a session on the next live shard (round robin); its id and base URL."""
        errors: list[str] = []
        for _ in range(len(self.shards)):
            shard = self.shards[self._next % len(self.shards)]
            self._next += 1
            try:
                return await self._open_on(shard, sampling, metadata)
            except ShardLost as exc:
                errors.append(str(exc))
        raise ShardLost("no gateway shard could take the session: " + "; ".join(errors))

    async def _open_on(self, shard: Shard, sampling: SamplingParams, metadata: dict[str, Any]) -> tuple[str, str]:
        """Open a session on ``shard``; its id and base URL.

        Raises:
            ShardLost: the shard is gone or does not answer.
            ConfigError: the shard refused the session.
        """
        import httpx

        body = {
            "sampling": {
                "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "top_k": sampling.top_k, "stop": list(sampling.stop),
                "stop_token_ids": list(sampling.stop_token_ids), "seed": sampling.seed,
            },
            "metadata": metadata,
        }
        if not shard.alive:
            raise shard.gone("")
        try:
            resp = await self._http.post(shard.root_url + "/admin/sessions", json=body)
        except httpx.TransportError as exc:
            raise shard.gone(f"stopped answering ({type(exc).__name__}: {exc})") from None
        if resp.status_code != 200:
            raise ConfigError(f"{shard.name()} refused a session: {resp.status_code} {resp.text[:300]}")
        sid = str(resp.json()["session_id"])
        self._owner[sid] = shard
        return sid, shard.base_url

    async def harvest(self, sid: str) -> Harvest | None:
        """The session's rows, counters and conversation from its shard; None when dropped."""
        import httpx

        shard = self._owner.pop(sid, None)
        if shard is None:
            return None
        if not shard.alive:
            raise shard.gone("")
        try:
            resp = await self._http.post(f"{shard.root_url}/admin/sessions/{sid}/harvest")
        except httpx.TransportError as exc:
            raise shard.gone(f"stopped answering ({type(exc).__name__}: {exc})") from None
        if resp.status_code == 401:  # dropped over the shard's admin routes
            return None
        if resp.status_code != 200:
            raise shard.gone(f"answered the harvest with {resp.status_code}: {resp.text[:300]}")
        return harvest_from_json(resp.json())

    async def stats(self) -> dict[str, float]:
        """``/admin/stats`` summed over the live shards (sessions, turns, CPU seconds)."""
        total: dict[str, float] = {}
        for shard in self.shards:
            if not shard.alive:
                continue
            resp = await self._http.get(shard.root_url + "/admin/stats")
            resp.raise_for_status()
            for key, value in resp.json().items():
                total[key] = total.get(key, 0) + value
        return total

    async def set_weight_version(self, version: int, retired: Mapping[str, str] | None = None) -> None:
        """Tell every live shard's HTTP sampler the weights now pushed, and the servers that
        push retired (``retired``: URL -> why), so no shard samples from them again; a shard
        that does not answer is stopped, as in ``hold``."""
        body = {"weight_version": int(version), "retired": dict(retired or {})}
        await self._tell_all("/admin/sampler", body, f"weight version {version}")

    async def announce(self, report: Any) -> None:
        """``set_weight_version`` from a ``core.samplers.weights.PushReport`` (``Fleet.after_push``)."""
        await self.set_weight_version(int(report.version), dict(report.retired))

    def follow(self, fleet: Any) -> None:
        """Move every shard's sampler with ``fleet``'s pushes (a ``core.trainer.fleet.Fleet``):
        held and released by its pusher, told the probe's retirements after each push, and
        told within ``VIEW_INTERVAL_S`` which servers the trainer routes to (a server back
        from unhealthy is re-pushed by the trainer before any shard routes to it)."""
        fleet.pusher.followers.append(self)
        fleet.after_push.append(self.announce)
        self._fleet = fleet.sampler
        self._fleet_task = asyncio.get_running_loop().create_task(self._watch_fleet(), name="tracerl-shards-fleet")

    def _view(self) -> dict[str, Any]:
        """The trainer's fleet as shards follow it: the servers it routes to, why the others
        are out, and those it retired."""
        pool = self._fleet.pool if self._fleet is not None else None
        if pool is None:
            return {}
        serving = [s.url for s in pool.servers if s.healthy and not s.needs_weights]
        out = {s.url: s.last_error or "unhealthy" for s in pool.servers if s.url not in serving}
        return {"serving": serving, "out": out, "retired": {s.url: s.last_error for s in pool.retired}}

    async def _watch_fleet(self) -> None:
        """Tell the shards each change of ``_view`` (the trainer's health checks run for it)."""
        sent: dict[str, Any] = {}
        assert self._fleet is not None
        while not self._http.is_closed:
            try:
                if not self._fleet.held:  # a sleeping fleet's checks stay off (core.samplers.sleep)
                    self._fleet.pool.ensure_health_checks(self._fleet.client())
                view = self._view()
                if view != sent:
                    await self._tell_all("/admin/sampler", view, "servers in rotation")
                    sent = view
            except Exception as exc:  # a bug here must not stop the shards' view for good
                if self._http.is_closed:
                    return
                print(f"warning: telling the gateway shards the fleet's servers failed: {exc!r}", file=sys.stderr)
            await asyncio.sleep(VIEW_INTERVAL_S)

    def collect_late_rewards(self, book: LateRewards | None) -> None:
        """Let ``reward_pending`` rollouts wait in ``book`` (the trainer's, which
        ``start_rollout_stack`` passes), and deliver to it the rewards posted to the shards
        (``POST /admin/rollouts/{id}/reward`` on the shard whose base URL the agent was given;
        ``core.rollout.shard_rewards``)."""
        self.late_rewards = book
        if book is not None and self._rewards_task is None:
            collector = RewardCollector(self._http, self.shards, book)
            loop = asyncio.get_running_loop()
            self._rewards_task = loop.create_task(collector.run(), name="tracerl-shards-rewards")

    def _stop_tasks(self) -> None:
        """Cancel the fleet view and the late-reward collection."""
        for task in (self._fleet_task, self._rewards_task):
            if task is not None:
                task.cancel()
        self._fleet_task = self._rewards_task = None

    async def hold(self, version: int) -> None:
        """Every live shard's sampler holds (``POST /admin/sampler/hold``, answered once
        nothing more reaches a server) before the push of ``version``; a shard that does not
        acknowledge within ``hold_timeout_s`` is stopped (its rollouts fail naming why)."""
        async with self._sampler_lock:
            self._held = version
            await self._tell_live("/admin/sampler/hold", {}, f"hold for the weight push to version {version}")

    async def release(self, report: Any) -> None:
        """After a push (``report``: a ``PushReport``, None when it failed): every live shard
        learns the version and the servers updated and retired, then samples again."""
        body = self._view()
        if report is not None:
            retired = {**body.get("retired", {}), **dict(report.retired)}
            body.update(weight_version=int(report.version), retired=retired, updated=list(report.updated))
        what = "release after the weight push" + (f" to version {report.version}" if report is not None else "")
        async with self._sampler_lock:
            self._held = None
            await self._tell_live("/admin/sampler/release", body, what)

    async def _tell_all(self, route: str, body: dict[str, Any], what: str) -> None:
        """``_tell`` every live shard what changed in the fleet (no hold or release)."""
        async with self._sampler_lock:
            await self._tell_live(route, body, what)

    async def _tell_live(self, route: str, body: dict[str, Any], what: str) -> None:
        """``_tell`` every live shard, remembering what they now know of the fleet for a shard
        that starts later; the caller holds ``_sampler_lock``."""
        if route != "/admin/sampler/hold":
            for key, value in body.items():
                if key == "retired":  # retired for good: a later message's list adds to it
                    self._fleet_state[key] = {**self._fleet_state.get(key, {}), **value}
                elif key != "updated":
                    self._fleet_state[key] = value
        await asyncio.gather(*(self._tell(s, route, body, what) for s in self.shards if s.alive))

    async def catch_up(self, shard: Shard) -> None:
        """Tell a shard started after the others what they were told: the weight version,
        the servers retired and in rotation, and a hold while a push is under way."""
        async with self._sampler_lock:
            if self._fleet_state:
                await self._tell(shard, "/admin/sampler", dict(self._fleet_state), "the fleet, for a shard started late")
            if self._held is not None:
                await self._tell(shard, "/admin/sampler/hold", {}, f"hold for the weight push to version {self._held}")

    async def _tell(self, shard: Shard, route: str, body: dict[str, Any], what: str) -> None:
        """POST ``route`` to ``shard``; one that does not answer 200 in time is stopped."""
        import httpx

        try:
            resp = await asyncio.wait_for(self._http.post(shard.root_url + route, json=body), self.hold_timeout_s)
        except TimeoutError:
            why = f"no answer within {self.hold_timeout_s:g} s"
        except httpx.TransportError as exc:
            why = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status_code == 200:
                return
            why = f"answered {resp.status_code}: {resp.text[:200]}"
        if not shard.alive:
            return  # it died on its own: its rollouts fail with its exit code
        lost = (
            f"did not acknowledge the {what} ({why}); stopped, so that it cannot sample from servers "
            "changing weights under the wrong version"
        )
        print(f"warning: {shard.name()} {lost}", file=sys.stderr)
        await self._kill(shard, lost)

    async def _kill(self, shard: Shard, lost: str) -> None:
        """Stop ``shard`` for good, ``lost`` saying why (what its rollouts fail with)."""
        assert isinstance(shard, _Shard)
        shard.lost = lost
        with contextlib.suppress(ProcessLookupError):
            shard.proc.kill()
        await shard.proc.wait()

    async def aclose(self) -> None:
        """Stop every shard (stdin closed, then SIGTERM, then SIGKILL); idempotent."""
        self._stop_tasks()
        await self._http.aclose()
        for shard in self.shards:
            if isinstance(shard, _Shard):
                await _stop(shard)
        shutil.rmtree(self._folder, ignore_errors=True)


def _child_env() -> dict[str, str]:
    """This environment, with this ``core`` first on the child's path."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


async def _await_listening(shard: _Shard, timeout_s: float) -> None:
    """Read the shard's stdout until its JSON line says where it listens."""
    assert shard.proc.stdout is not None

    async def read() -> None:
        assert shard.proc.stdout is not None
        while True:
            line = await shard.proc.stdout.readline()
            if not line:
                await shard.proc.wait()
                raise RuntimeStartError(
                    f"{shard.name()} exited with code {shard.proc.returncode} before listening "
                    "(its error is on stderr above)"
                )
            with contextlib.suppress(ValueError):
                info = json.loads(line)
                if isinstance(info, dict) and "root_url" in info:
                    shard.root_url = str(info["root_url"])
                    return

    try:
        await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise RuntimeStartError(f"{shard.name()} did not listen within {timeout_s:g} s") from None


async def _stop(shard: _Shard) -> None:
    proc = shard.proc
    if proc.returncode is None and proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

"""The ``local`` runtime: the user's agent app served by a pool of local processes.

Defines ``LocalRuntime`` (a ``core.interfaces.RolloutRuntime``).

Each of ``num_processes`` servers (``python -m core.agent module:attr``) serves
many sessions at once, each session in its own directory. A rollout goes to
the least busy healthy process, is started in the background and its output
collected over HTTP (start/get, long-polled) or S3. Every agent fault comes
back as a failed ``RolloutResult``; a process that died is restarted while the
rest of the pool keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from core.errors import ConfigError, RuntimeStartError
from core.http import FastClient
from core.runtime._agent_env import S3_CHANNEL
from core.runtime._channels import AgentFault, HttpChannel, Invocation, S3Channel
from core.runtime._process import AgentProcess
from core.runtime._results import failed, result_from_output
from core.runtime._run_config import agent_app, check_agent_ref, node_values, with_overrides
from core.runtime.base import RolloutClock, RuntimeBase
from core.runtime.config import LocalRuntimeConfig
from core.types import RolloutRequest, RolloutResult, RolloutStatus

if TYPE_CHECKING:
    from omegaconf import DictConfig

logger = logging.getLogger("core.runtime.local")


class LocalRuntime(RuntimeBase):
    """Runs rollouts on a pool of local agent server processes.

    Example:
        >>> rt = LocalRuntime("examples.math_agent.agent:app", num_processes=2)
        >>> await rt.start()
        >>> result = await rt.run_rollout(request)
        >>> await rt.aclose()

    Args:
        agent: The agent app as ``module:attribute`` (importable from the current
            working directory or the environment's ``sys.path``).
        config: Pool settings; keyword ``overrides`` replace single fields.
        env: Extra environment variables for the agent processes.
        **overrides: Any ``LocalRuntimeConfig`` field, e.g. ``num_processes=4``.

    Raises:
        ConfigError: ``agent`` is not ``module:attribute`` or a setting is out of range.
    """

    kind = "local"

    def __init__(
        self,
        agent: str,
        *,
        config: LocalRuntimeConfig | None = None,
        env: dict[str, str] | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        self.config = with_overrides(config or LocalRuntimeConfig(), overrides, runtime="LocalRuntime")
        check_agent_ref(agent)
        c = self.config
        if c.num_processes < 1 or c.max_concurrency < 1:
            raise ConfigError(
                f"runtime.num_processes and runtime.max_concurrency must be >= 1, "
                f"got {c.num_processes!r} and {c.max_concurrency!r}"
            )
        if c.result_channel not in ("http", "s3"):
            raise ConfigError(
                f"runtime.result_channel must be 'http' or 's3', got {c.result_channel!r}"
            )
        if c.result_channel == "s3" and not c.s3_bucket:
            raise ConfigError("runtime.result_channel=s3 needs runtime.s3_bucket")
        self.agent = agent
        self.env = dict(env or {})
        self._root: Path | None = None
        self._own_root = False
        self._procs: list[AgentProcess] = []
        self._client: FastClient | None = None
        self._channel: HttpChannel | S3Channel | None = None
        self._sem = asyncio.Semaphore(c.max_concurrency)

    @classmethod
    def from_config(cls, cfg: DictConfig, *, node: DictConfig | None = None) -> LocalRuntime:
        """Build from the composed Hydra config (``cfg.runtime``, ``cfg.task.agent``, ``cfg.task.agent_env``).

        Args:
            cfg: The composed run config (``core.config.TrainConfig``).
            node: The runtime settings to read instead of ``cfg.runtime``: a plugin
                that wraps this runtime passes its own node (a ``LocalRuntimeConfig``
                subclass). Only the ``LocalRuntimeConfig`` fields are read; a
                wrapper's extra fields (and ``name``) are left to the wrapper.
        """
        agent, env = agent_app(cfg)
        settings = cfg.runtime if node is None else node
        values = node_values(settings, LocalRuntimeConfig, leave_out=("name",))
        return cls(agent, config=LocalRuntimeConfig(**values), env=env)

    # -- lifecycle --------------------------------------------------------------------

    @property
    def processes(self) -> list[AgentProcess]:
        """The pool (for inspection and fault tests)."""
        return list(self._procs)

    @property
    def root(self) -> Path | None:
        """Folder holding process logs (``p<i>.log``) and session directories."""
        return self._root

    async def _start(self) -> None:
        """Spawn the pool and wait until every process answers ``/ping``.

        Raises:
            RuntimeStartError: a process exited or never listened; the message has its log tail.
        """
        c = self.config
        httpx_log = logging.getLogger("httpx")
        if httpx_log.level == logging.NOTSET:
            # One INFO line per start/get poll would drown the trainer's console.
            httpx_log.setLevel(logging.WARNING)
        if c.workdir:
            self._root = Path(c.workdir)
            self._root.mkdir(parents=True, exist_ok=True)
        else:
            self._root = Path(tempfile.mkdtemp(prefix="tracerl-local-"))
            self._own_root = True
        self._client = FastClient(max_connections=c.max_concurrency + 8 * c.num_processes)
        if c.result_channel == "s3":
            self._channel = S3Channel(
                self._client,
                bucket=c.s3_bucket,
                exp_id=c.s3_exp_id,
                endpoint_url=c.s3_endpoint_url,
                poll_interval_s=max(c.poll_interval_s, 0.05),
            )
        else:
            self._channel = HttpChannel(self._client, poll_interval_s=c.poll_interval_s)
        pass_env = [*c.pass_env, *(S3_CHANNEL if c.result_channel == "s3" else ())]
        self._procs = [
            AgentProcess(
                i, self.agent, self._root, env=self.env, pass_env=pass_env, python=c.python, host=c.host
            )
            for i in range(c.num_processes)
        ]
        for proc in self._procs:
            proc.spawn()
        client = self._client
        results = await asyncio.gather(
            *(p.wait_ready(client, c.startup_timeout_s) for p in self._procs),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._shutdown()
            raise (
                errors[0]
                if isinstance(errors[0], RuntimeStartError)
                else RuntimeStartError(f"agent pool failed to start: {errors[0]!r}")
            )

    async def _shutdown(self) -> None:
        """Stop the pool, close the client, remove the temporary folder."""
        self._cancel_background()
        await asyncio.gather(*(p.stop() for p in self._procs), return_exceptions=True)
        if isinstance(self._channel, S3Channel):
            self._channel.close()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._own_root and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    # -- rollouts ---------------------------------------------------------------------

    def _payload(self, request: RolloutRequest) -> dict[str, Any]:
        """The dataset row plus the model config in both toolkit shapes.

        ``_config`` is what ``AgentCoreRuntimeApp`` agents read; the same fields
        under ``_rollout`` serve agents written for ``AgentCoreRLApp``.
        """
        model = {
            "base_url": request.base_url,
            "model_id": request.model_id,
            "api_key": request.session_id,
            "sampling_params": dict(request.sampling_params),
            # Names the rollout for a reward posted later (POST /admin/rollouts/{id}/reward).
            "rollout_id": request.rollout_id,
        }
        rollout = request.payload.get("_rollout")
        return {
            **request.payload,
            "_config": model,
            "_rollout": {**(rollout if isinstance(rollout, dict) else {}), **model},
        }

    async def _run(self, request: RolloutRequest, clock: RolloutClock) -> RolloutResult:
        """One rollout on the least busy process; cancelled by us, it is cancelled there too."""
        rid = request.rollout_id
        inv: Invocation | None = None
        try:
            async with self._sem:
                clock.restart()  # queueing for a slot is not the rollout's time
                try:
                    inv = await self._invocation(request)
                except AgentFault as fault:
                    return failed(rid, fault.status, str(fault), clock.elapsed())
                # Nor is waiting for a process the runtime is restarting: under load a restart
                # alone could use up the deadline.
                clock.restart()
                try:
                    async with asyncio.timeout(request.timeout_s):
                        return await self._collect(inv, rid, clock)
                except TimeoutError:
                    await self._cancel_remote(inv)
                    await self._recycle_if_stuck(inv)
                    return failed(
                        rid,
                        RolloutStatus.TIMEOUT,
                        f"the rollout ran past its {request.timeout_s:g}s timeout and was cancelled",
                        clock.elapsed(),
                    )
        except asyncio.CancelledError:
            if self._cancelled_by_us(rid) and inv is not None:
                await self._cancel_remote(inv)
                await self._recycle_if_stuck(inv)
            raise
        finally:
            if inv is not None:
                inv.proc.in_flight -= 1
                if not self.config.keep_workdirs:
                    self._remove_workdir(inv)

    async def _invocation(self, request: RolloutRequest) -> Invocation:
        proc = await self._pick()
        proc.in_flight += 1
        return Invocation(
            proc=proc,
            generation=proc.generation,
            pid=proc.pid,
            session_id=request.session_id,
            invocation_id=uuid.uuid4().hex,
            payload=self._payload(request),
            group_id=request.group_id,
        )

    async def _pick(self) -> AgentProcess:
        """The least busy healthy process; waits while a restart is under way."""
        while True:
            healthy = []
            for proc in self._procs:
                if proc.alive():
                    if proc.healthy:
                        healthy.append(proc)
                else:  # died, maybe while idle: replace it in the background
                    self._schedule_restart(proc)
            if healthy:
                return min(healthy, key=lambda p: p.in_flight)
            if not self._background:
                raise _NoProcess(
                    "no agent process is healthy and none can be restarted "
                    f"(max_restarts={self.config.max_restarts}); see the logs in {str(self._root)!r}"
                )
            await asyncio.sleep(0.05)

    async def _collect(self, inv: Invocation, rid: str, clock: RolloutClock) -> RolloutResult:
        """The invocation's output as a result; a dead process is restarted."""
        assert self._channel is not None
        try:
            output = await self._channel.run(inv)
        except AgentFault as fault:
            if fault.status is RolloutStatus.CRASHED and not inv.proc.alive():
                self._schedule_restart(inv.proc)
            return failed(rid, fault.status, self._replaced(inv, str(fault)), clock.elapsed())
        except httpx.HTTPError as exc:
            return await self._transport_failure(inv, rid, exc, clock)
        return result_from_output(rid, output, clock.elapsed())

    async def _transport_failure(
        self, inv: Invocation, rid: str, exc: Exception, clock: RolloutClock
    ) -> RolloutResult:
        proc = inv.proc
        for _ in range(20):  # a killed process drops its sockets a moment before it is reaped
            if not proc.alive() or inv.generation != proc.generation:
                break
            await asyncio.sleep(0.05)
        elapsed = clock.elapsed()
        if inv.generation != proc.generation:
            what = self._replaced(
                inv, f"agent process {proc.index} (pid {inv.pid}) dropped the connection mid-rollout and was restarted"
            )
        elif proc.proc is not None and proc.proc.poll() is not None:
            what = f"agent process {proc.index} (pid {proc.pid}) exited with code {proc.proc.returncode} mid-rollout"
            self._schedule_restart(proc)
        else:
            what = f"agent process {proc.index} could not be reached ({type(exc).__name__}: {exc})"
        return failed(rid, RolloutStatus.CRASHED, f"{what}; log: {proc.log_path}", elapsed)

    def _schedule_restart(self, proc: AgentProcess, *, recycle_because: str = "") -> None:
        proc.healthy = False
        if self._closed or (not recycle_because and proc.restarts >= self.config.max_restarts):
            return
        name = f"restart-{proc.index}"
        if self._background_running(name):
            return
        assert self._client is not None
        self._in_background(
            proc.restart(
                self._client, self.config.startup_timeout_s, recycle_because=recycle_because
            ),
            name,
        )
        if recycle_because:
            logger.warning(
                "agent process %d (pid %s) is recycled: %s; see %s",
                proc.index,
                proc.pid,
                recycle_because,
                proc.log_path,
            )
        else:
            logger.warning(
                "agent process %d died; restarting it (restart %d)", proc.index, proc.restarts + 1
            )

    @staticmethod
    def _replaced(inv: Invocation, error: str) -> str:
        """``error``, led by why the process was replaced when that is what ended the rollout."""
        proc = inv.proc
        if inv.generation == proc.generation or not proc.replaced_because:
            return error
        return f"agent process {proc.index} was replaced mid-rollout because {proc.replaced_because} ({error})"

    async def _recycle_if_stuck(self, inv: Invocation) -> None:
        """Replace ``inv``'s process if handlers stuck past their rollouts' end exhausted its pool.

        Called after a rollout timed out or was cancelled (its handler may be one
        of them). The agent's ``/ping`` answers 503 once every handler thread is
        taken and counts the threads still running for cancelled invocations.
        Both together mean the process cannot serve sync handlers any more:
        every rollout sent there would wait for a thread until its own timeout.
        The process is killed and respawned; rollouts still in flight on it
        fail ``crashed`` saying so, new ones wait for the fresh process.
        """
        proc = inv.proc
        if self._closed or self._client is None or inv.generation != proc.generation:
            return
        if not proc.alive() or not proc.healthy:
            return
        try:
            r = await self._client.get(f"{proc.base_url}/ping", timeout=2.0)
            threads = r.json().get("threads") if r.status_code == 503 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        if not isinstance(threads, dict) or int(threads.get("abandoned") or 0) < 1:
            return
        why = (
            f"all {threads.get('max')} of its handler threads were busy, "
            f"{threads.get('abandoned')} of them with handlers still running after their "
            "rollout timed out or was cancelled (sync handlers cannot be interrupted)"
        )
        if inv.generation != proc.generation or not proc.healthy:
            return  # someone else replaced it while we asked
        self._schedule_restart(proc, recycle_because=why)

    async def _cancel_remote(self, inv: Invocation) -> None:
        if self._channel is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._channel.cancel(inv)), timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            pass

    def _remove_workdir(self, inv: Invocation) -> None:
        if self._root is None:
            return
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in inv.session_id)[:200]
        path = self._root / "sessions" / (safe.lstrip(".") or "_")
        if path.exists():  # agents create it only when they use it
            shutil.rmtree(path, ignore_errors=True)


class _NoProcess(AgentFault):
    def __init__(self, message: str) -> None:
        super().__init__(RolloutStatus.CRASHED, message)

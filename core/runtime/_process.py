"""One local agent server process: spawn, health-check, restart.

Defines ``AgentProcess``. The process runs ``python -m core.agent module:attr
--port 0 --port-file F``: it binds a free port itself and reports it through
the file, so no two processes ever race for a port. Health means ``GET /ping``
answers 200. Output goes to a log file whose tail ends up in error messages.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from core.agent._auth import TOKEN_ENV, TOKEN_HEADER
from core.agent._reap import descendants, kill_pids
from core.errors import RuntimeStartError
from core.http import HTTPClient
from core.runtime._agent_env import agent_environment


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode(errors="replace").strip()


class AgentProcess:
    """A supervised ``python -m core.agent`` server.

    Args:
        index: Position in the pool (names its folder and log).
        agent: The agent app as ``module:attribute``.
        root: Folder for this runtime; the process gets ``root/p<index>/``.
        env: Environment variables set explicitly (``task.agent_env``).
        pass_env: Names (globs) of this process's environment passed on besides the
            allowlist (``_agent_env.ALLOWED``); nothing else of it reaches the agent.
        python: Interpreter to run; empty uses the trainer's.
        host: Address to bind.
    """

    def __init__(
        self,
        index: int,
        agent: str,
        root: Path,
        *,
        env: dict[str, str] | None = None,
        pass_env: list[str] | tuple[str, ...] = (),
        python: str = "",
        host: str = "127.0.0.1",
    ) -> None:
        self.index = index
        self.agent = agent
        self.host = host
        self.python = python or sys.executable
        self.dir = root / f"p{index}"
        self.sessions_dir = root / "sessions"
        self.log_path = root / f"p{index}.log"
        self.port_file = self.dir / "port"
        self.env = dict(env or {})
        self.pass_env = tuple(pass_env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.in_flight = 0
        self.restarts = 0
        """Replacements after the process died (bounded by ``max_restarts``)."""
        self.recycles = 0
        """Replacements of a live process whose handlers were stuck (not bounded)."""
        self.generation = 0
        """Spawns so far minus one: a change means the process serving a rollout was replaced."""
        self.replaced_because = ""
        """Why the last replacement happened (for the errors of rollouts it ended)."""
        self.healthy = False
        self.token = ""
        """The invocation token of the current spawn (a new one per spawn)."""
        self.speaks_tracerl = False
        """Set once the process answered like a ``core.agent`` server (long-poll on start)."""
        self._restart_lock = asyncio.Lock()

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        return f"http://{self.host}:{self.port}"

    @property
    def auth_headers(self) -> dict[str, str]:
        """Headers that authorise a request to the running server."""
        return {TOKEN_HEADER: self.token}

    @property
    def pid(self) -> int | None:
        """Process id, when running."""
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        """True while the OS process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        """Start the process (non-blocking); ``wait_ready`` waits for ``/ping``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sessions_dir.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        env = agent_environment(os.environ, explicit=self.env, pass_env=self.pass_env)
        # The trainer's working directory stays importable (agent modules are given
        # relative to it) although the agent runs inside its own folder.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p
        )
        env["TRACERL_AGENT_WORKDIR_ROOT"] = str(self.sessions_dir)
        self.token = secrets.token_urlsafe(32)
        env[TOKEN_ENV] = self.token
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [self.python, "-m", "core.agent", self.agent, "--host", self.host]
        cmd += ["--port", "0", "--port-file", str(self.port_file), "--parent-pid", str(os.getpid())]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.port = None
        self.healthy = False

    async def wait_ready(self, client: HTTPClient, timeout_s: float) -> None:
        """Wait until the process answers ``/ping`` with 200.

        Raises:
            RuntimeStartError: it exited or did not answer within ``timeout_s``;
                the message carries the tail of its log.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise RuntimeStartError(self._failure(f"exited with code {code} before listening"))
            if self.port is None and self.port_file.exists():
                text = self.port_file.read_text().strip()
                self.port = int(text) if text.isdigit() else None
            if self.port is not None:
                try:
                    r = await client.get(f"{self.base_url}/ping", timeout=2.0)
                    if r.status_code == 200:
                        self.healthy = True
                        return
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise RuntimeStartError(
            self._failure(f"did not answer GET /ping within {timeout_s:g}s")
            + "; raise runtime.startup_timeout_s if the agent imports slowly"
        )

    def _failure(self, what: str) -> str:
        tail = _tail(self.log_path)
        return f"agent process {self.index} ({self.agent!r}) {what}. Log {str(self.log_path)!r}" + (
            f" ends with:\n{tail}" if tail else " is empty"
        )

    async def restart(
        self, client: HTTPClient, timeout_s: float, *, recycle_because: str = ""
    ) -> bool:
        """Replace the process; False (and ``healthy`` False) if the new one never listens.

        Without ``recycle_because`` this replaces a dead process, and concurrent
        callers share one restart: whoever finds the process already replaced and
        healthy returns at once. With it, a live process is killed and replaced
        (a recycle, which does not count against ``max_restarts``).
        """
        async with self._restart_lock:
            if self.alive() and self.healthy and not recycle_because:
                return True
            self.kill()
            if recycle_because:
                self.recycles += 1
                self.replaced_because = f"it was recycled: {recycle_because}"
            else:
                self.restarts += 1
                self.replaced_because = "it died and was restarted"
            self.generation += 1
            self.spawn()
            try:
                await self.wait_ready(client, timeout_s)
            except RuntimeStartError:
                self.kill()
                return False
            return True

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (agents may start children) and reap it.

        Descendants that left the group (``setsid`` tools and sandboxes) are
        found through ``/proc`` first and killed as well.
        """
        self.healthy = False
        if self.proc is None or self.proc.poll() is not None:
            return
        strays = descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        kill_pids(strays)

    async def stop(self) -> None:
        """SIGTERM, a short grace period, then SIGKILL (strays outside the group: SIGKILL)."""
        self.healthy = False
        if self.proc is None or self.proc.poll() is not None:
            return
        strays = descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(40):
            if self.proc.poll() is not None:
                kill_pids(strays)
                return
            await asyncio.sleep(0.05)
        self.kill()
        kill_pids(strays)

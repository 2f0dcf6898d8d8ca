"""``StandInServer``: serve an ``AcrStandIn`` with uvicorn on a thread of its own.

A thread with its own event loop keeps the stand-in's timing independent of
the caller's loop (the TPS measurements read arrival times here), and lets a
synchronous script or test start and stop it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from core.testing.agentcore_standin._app import AcrStandIn

EXAMPLE_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/standin_agent-AbCdEf1234"
"""An ARN of the right shape for trying the stand-in (any ARN is served unless ``arn`` is set)."""


class StandInServer:
    """Runs ``standin`` on ``host:port`` (0 picks a free port) until ``stop()``.

    Example:
        >>> server = StandInServer(AcrStandIn(agent="my_agent:app")).start()
        >>> boto3.client("bedrock-agentcore", endpoint_url=server.url, region_name="us-west-2")
        >>> server.stop()
    """

    def __init__(self, standin: AcrStandIn, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.standin = standin
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port``, the ``endpoint_url`` to give boto3."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> StandInServer:
        """Bind, start serving and wait until the app's startup completed."""
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.standin, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=60
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
            name="acr-standin",
            daemon=True,
        )
        self._thread.start()
        deadline = timeout_s
        while not self._server.started and deadline > 0 and self._thread.is_alive():
            threading.Event().wait(0.02)
            deadline -= 0.02
        if not self._server.started:
            raise RuntimeError(f"the AgentCore stand-in did not start on {self.url}")
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving; the lifespan shutdown kills every session's agent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> StandInServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

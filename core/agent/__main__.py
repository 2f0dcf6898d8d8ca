"""``python -m core.agent module:attr [--host H] [--port N] [--port-file F]``: serve an agent app.

``attr`` may be a ``core.agent.AgentApp`` or any ASGI app (for example an
agentcore-rl-toolkit ``AgentCoreRLApp``, which is a Starlette app), so agents
written for the toolkit run unchanged. ``--port 0`` binds a free port; with
``--port-file`` the bound port is written there once the socket listens,
which is how the local runtime learns it without racing for ports.

The server listens on loopback unless ``--host`` says otherwise (a container
passes ``--host 0.0.0.0``). With ``$TRACERL_AGENT_TOKEN`` set, every request
but ``GET /ping`` must carry it in ``X-Tracerl-Agent-Token`` or gets 401.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import os
import socket
import sys
import threading
import time
from typing import Any

from core.agent._auth import TOKEN_ENV, TOKEN_HEADER, guard, token_from_env
from core.agent._reap import kill_tree


def load_app(spec: str) -> Any:
    """Import ``module:attr`` and return the attribute.

    Raises:
        ValueError: ``spec`` is not of the form ``module:attr`` or the attribute is missing.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"agent must be given as 'module:attribute', got {spec!r}")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"module {module_name!r} has no attribute {attr!r}; "
                f"point the agent at the AgentApp instance, e.g. '{module_name}:app'"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec!r} is a {type(obj).__name__}, not an ASGI app")
    return obj


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _exit_with_parent(pid: int) -> None:
    """Exit, with everything this agent started, once ``pid`` is gone.

    The parent is also gone when we were reparented (``getppid`` changed), which
    catches a recycled pid that ``kill(pid, 0)`` would take for the trainer.
    """
    parent_at_start = os.getppid()

    def gone() -> bool:
        if parent_at_start == pid and os.getppid() != pid:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, owned by someone else
            return False
        return False

    def watch() -> None:
        while not gone():
            time.sleep(0.5)
        # Take everything this agent started along (tools, sandboxes, their
        # children), then go: a killed trainer must leave no process behind.
        kill_tree(os.getpid())
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.agent", description=__doc__)
    parser.add_argument("app", help="the agent app as module:attribute")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default loopback; containers pass 0.0.0.0)",
    )
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--port-file", default="", help="write the bound port here")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=0,
        help="exit when this process is gone (the local runtime sets it, so a killed "
        "trainer leaves no agent processes behind)",
    )
    args = parser.parse_args(argv)
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = load_app(args.app)
    token = token_from_env()
    if not token and not _is_loopback(args.host):
        print(
            f"warning: serving {args.app} on {args.host} without {TOKEN_ENV}: anyone who can reach "
            "this port can invoke the agent. Set a token (and send it as "
            f"{TOKEN_HEADER}) unless the network in front authenticates callers, as "
            "AgentCore Runtime does.",
            file=sys.stderr,
        )
    app = guard(app, token)

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)
    port = sock.getsockname()[1]
    if args.port_file:
        tmp = f"{args.port_file}.tmp"
        with open(tmp, "w") as fh:
            fh.write(str(port))
        os.replace(tmp, args.port_file)
    config = uvicorn.Config(
        app, log_level=args.log_level, access_log=False, timeout_keep_alive=30, backlog=2048
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())

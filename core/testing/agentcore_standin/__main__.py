"""``python -m core.testing.agentcore_standin module:attr | --agent-url URL [--port N]``.

Serves the AgentCore Runtime data plane locally; then train against it with
``runtime=agentcore runtime.endpoint_url=http://127.0.0.1:N
runtime.agent_runtime_arn=<any runtime ARN>``.
"""

from __future__ import annotations

import argparse
import os
import sys

from core.agent._auth import TOKEN_ENV
from core.testing.agentcore_standin._app import AcrStandIn
from core.testing.agentcore_standin._server import EXAMPLE_ARN

STANDIN_CREDENTIALS = "AWS_ACCESS_KEY_ID=standin AWS_SECRET_ACCESS_KEY=standin"
"""Dummy credentials: boto3 signs every call, the stand-in checks no signature."""

STANDIN_BATCH = (
    "trainer.batch_size=2 trainer.group_size=4 runtime.max_concurrency=8"
)
"""A batch the stand-in serves on a laptop: one agent process per session (a
Python start each, about a second of CPU), so 8 sessions a step, not 256."""


def train_command(url: str) -> str:
    """The ``python -m core.train`` line that trains against a stand-in at ``url``
    (docs/agentcore.md quotes it)."""
    return (
        f"{STANDIN_CREDENTIALS} python -m core.train runtime=agentcore "
        f"runtime.endpoint_url={url} runtime.agent_runtime_arn={EXAMPLE_ARN} "
        f"runtime.result_channel=http {STANDIN_BATCH}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.testing.agentcore_standin", description=__doc__)
    parser.add_argument("agent", nargs="?", default="", help="agent app as module:attr (one process per session)")
    parser.add_argument("--agent-url", default="", help="forward to an agent already listening (e.g. a container)")
    parser.add_argument(
        "--agent-token",
        default=os.environ.get(TOKEN_ENV, ""),
        help=f"token the --agent-url agent demands (default ${TOKEN_ENV})",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--tps-limit", type=float, default=25.0, help="answer 429 above this rate (0: off)")
    parser.add_argument("--cold-start-failures", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=60.0)
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=60.0,
        help="stop a session idle this long whose agent is not HealthyBusy (AgentCore: 900)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="most sessions (agent processes) alive at once; 0: no cap",
    )
    args = parser.parse_args(argv)
    if bool(args.agent) == bool(args.agent_url):
        parser.error("give an agent as module:attr, or --agent-url, not both")

    import uvicorn

    standin = AcrStandIn(
        agent=args.agent,
        agent_url=args.agent_url,
        agent_token=args.agent_token,
        tps_limit=args.tps_limit,
        cold_start_failures=args.cold_start_failures,
        startup_timeout_s=args.startup_timeout,
        idle_timeout_s=args.idle_timeout,
        max_sessions=args.max_sessions,
    )
    print(
        f"AgentCore stand-in on http://{args.host}:{args.port}; train against it with\n"
        f"  {train_command(f'http://{args.host}:{args.port}')}",
        file=sys.stderr,
    )
    uvicorn.run(standin, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The invocation token: only callers holding it may invoke an agent server.

Defines ``TOKEN_ENV`` (the environment variable a runtime sets for the agent
process), ``TOKEN_HEADER`` (the header it sends with every invocation) and
``TokenGuard``, an ASGI wrapper answering 401 to requests without the token.

``/ping`` stays open: health checkers (AgentCore's, Docker's, a load
balancer's) cannot send a token, and it reveals only whether the agent is busy.
Without a token in the environment the guard lets everything through, which
is right where something else authenticates callers (AgentCore Runtime admits
only IAM-signed InvokeAgentRuntime calls) or the server listens on loopback.
"""

from __future__ import annotations

import hmac
import json
import os
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_ENV = "TRACERL_AGENT_TOKEN"
"""Environment variable holding the token the agent server demands."""

TOKEN_HEADER = "X-Tracerl-Agent-Token"
"""Header that carries the token on each request."""

OPEN_PATHS = frozenset({"/ping"})
"""Paths served without the token."""

_HEADER_BYTES = TOKEN_HEADER.lower().encode()


def token_from_env() -> str:
    """The token set for this process, or '' when none is."""
    return os.environ.get(TOKEN_ENV, "").strip()


class TokenGuard:
    """Wraps any ASGI app (a ``core.agent.AgentApp`` or a toolkit app) with the token check.

    Args:
        app: The agent app.
        token: The token to demand; empty lets every request through.
    """

    def __init__(self, app: ASGIApp | Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.token
            or scope["type"] not in ("http", "websocket")
            or scope.get("path") in OPEN_PATHS
            or self._holds_token(scope)
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {
                "error": f"missing or wrong {TOKEN_HEADER} header: this agent server demands the "
                f"token set in its {TOKEN_ENV} environment variable (the tracerl runtime "
                "that started it sends it)"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", TOKEN_HEADER.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _holds_token(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == _HEADER_BYTES:
                return hmac.compare_digest(value, self.token)
        return False


def guard(app: Any, token: str | None = None) -> Any:
    """``app`` behind a ``TokenGuard`` for ``token`` (default: ``$TRACERL_AGENT_TOKEN``); unchanged without one."""
    token = token_from_env() if token is None else token
    return TokenGuard(app, token) if token else app

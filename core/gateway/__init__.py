"""The token-capturing, OpenAI- and Anthropic-compatible gateway.

Exports:

- ``Gateway``: sessions, rendering, sampling and trace capture (in-process API).
- ``GatewayServer``: uvicorn serving a ``Gateway`` inside the current loop.
- ``GatewayConfig``: settings (history mode, tool parser, limits).
- ``GatewayError``: an HTTP-visible failure.
- ``build_app``: the ASGI app (turn routes on a lean path, the rest on Starlette), for custom hosting.
"""

from __future__ import annotations

from core.gateway.app import build_app
from core.gateway.config import GatewayConfig
from core.gateway.errors import GatewayError
from core.gateway.server import GatewayServer
from core.gateway.service import Gateway
from core.gateway.turn import TurnRequest, TurnResult

__all__ = ["Gateway", "GatewayConfig", "GatewayError", "GatewayServer", "TurnRequest", "TurnResult", "build_app"]

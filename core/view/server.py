"""The viewer's local HTTP server (stdlib ``http.server``; one thread per request).

Routes: ``/`` the page, ``/api/run`` the overview, ``/api/step?kind=&step=`` one
step's rollouts, ``/api/rollout?kind=&step=&id=`` one rollout in full. Every
answer is read from disk when asked, so a page refresh shows a running
training's new steps. It listens on loopback by default and answers only
requests whose ``Host`` names the address it listens on (a web page elsewhere
cannot read a run through DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from core.view.data import RunData
from core.view.page import csp, render_page


class ViewServer(ThreadingHTTPServer):
    """Serves one run; ``url`` is where to point a browser."""

    daemon_threads = True

    def __init__(self, run_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.data = RunData(run_dir)
        if ":" in host:  # an IPv6 address (``--host ::1``): the stdlib server defaults to IPv4
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self.host = host

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def allowed_host(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this server (a loopback name or its address)."""
        if not header:
            return False
        name = header.rsplit(":", 1)[0] if not header.endswith("]") else header
        name = name.strip("[]").lower()
        if name in ("localhost", str(self.server_address[0]).lower()):
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        if self.host in ("0.0.0.0", "::", ""):
            return True  # the user chose to listen on every address: any address of ours
        return ip.is_loopback and ipaddress.ip_address(str(self.server_address[0])).is_loopback

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, notebooks); ``shutdown()`` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="tracerl-view", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        return  # quiet: the terminal shows the URL, not every poll

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
        self._send(status, body, "application/json; charset=utf-8")

    def do_HEAD(self) -> None:  # noqa: N802 - stdlib's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        if not self.server.allowed_host(self.headers.get("Host")):
            self._json(HTTPStatus.FORBIDDEN, {"error": "unexpected Host header; open the URL the viewer printed"})
            return
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        data = self.server.data
        try:
            if parts.path in ("/", "/index.html"):
                page, nonce = render_page(title=f"tracerl · {data.run_dir.name}")
                self._send(
                    HTTPStatus.OK,
                    page.encode(),
                    "text/html; charset=utf-8",
                    {"Content-Security-Policy": csp(nonce), "X-Frame-Options": "DENY"},
                )
            elif parts.path == "/api/run":
                self._json(HTTPStatus.OK, data.overview())
            elif parts.path == "/api/step":
                self._json(HTTPStatus.OK, data.step(query.get("kind", "train"), int(query["step"])))
            elif parts.path == "/api/rollout":
                self._json(
                    HTTPStatus.OK, data.rollout(query.get("kind", "train"), int(query["step"]), query["id"])
                )
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {parts.path}"})
        except KeyError as exc:
            self._json(HTTPStatus.NOT_FOUND, {"error": str(exc.args[0]) if exc.args else "not found"})
        except ValueError as exc:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except OSError as exc:  # unreadable file (permissions, deleted mid-read): say so, keep serving
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"cannot read the run's files: {exc}"})

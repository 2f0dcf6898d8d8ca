"""The viewer's single HTML page: inline CSS and JS from ``core/view/static/``, no CDN.

Served live (the page fetches ``api/...``) or written as one self-contained file
with the run's data embedded as JSON. Agent text is untrusted: the page builds
every element with DOM calls and ``textContent`` (never ``innerHTML``), the
embedded JSON has every ``<`` escaped so no string can close its script tag, and
a Content-Security-Policy allows only the page's own nonce'd script.
"""

from __future__ import annotations

import json
import secrets
from importlib import resources
from typing import Any


def _static(name: str) -> str:
    return resources.files("core.view").joinpath("static", name).read_text(encoding="utf-8")


def csp(nonce: str) -> str:
    """The page's Content-Security-Policy: its own script and styles, data fetched from itself."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
    )


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">`` (no ``<`` left)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(*, nonce: str | None = None, data: Any = None, title: str = "tracerl run") -> tuple[str, str]:
    """The page HTML and its nonce; ``data`` (``RunData.export()``) makes it static."""
    nonce = nonce or secrets.token_urlsafe(16)
    embedded = ""
    if data is not None:
        embedded = f'<script type="application/json" id="tracerl-data">{embed_json(data)}</script>'
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{csp(nonce)}">'
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{safe_title}</title>"
        f'<style nonce="{nonce}">{_static("app.css")}</style></head>'
        f'<body><div id="app"><p class="muted">Loading…</p></div>{embedded}'
        f'<script nonce="{nonce}">{_static("app.js")}</script></body></html>'
    )
    return page, nonce

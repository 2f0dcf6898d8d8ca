"""Config schema of the gateway section: ``GatewayConfig``, and ``SHARDS_PER_NODE``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SHARDS_PER_NODE = "per_node"
"""``gateway.shards`` value for one gateway process on each Ray node that hosts agents."""


@dataclass
class GatewayConfig:
    """Where the gateway listens and how it renders and records turns."""

    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 0
    """Port to bind; 0 picks a free one (pin it to open a narrow firewall rule)."""
    public_host: str = ""
    """Address agents dial; empty means ``host``. Must not be loopback for remote runtimes."""
    history_mode: str = "linear"
    """``linear`` (one row per append-only session) or ``tree`` (fork on divergence)."""
    max_context_tokens: int = 4096
    """Per-session context budget; beyond it requests get ``context_length_exceeded``."""
    tool_parser: str = "auto"
    """Tool-call parser: auto, hermes (Qwen3 JSON), qwen3_coder (XML), llama3_json, deepseek_v3,
    deepseek_v31, minimax_m2, kimi_k2, harmony (gpt-oss), glm45, mistral, none."""
    reasoning_parser: str = "auto"
    """How reasoning is split off a turn's text for the client: auto (``harmony`` for a
    template with harmony channels, ``think`` when it mentions ``</think>``), think
    (``<think>…</think>``), harmony (gpt-oss's analysis channel), none."""
    keep_reasoning: bool = False
    """Extend the served tokens (past reasoning included) even where the chat template
    would drop past reasoning from history or close the turn with another token: one
    row per session, but prompts the template itself never produces. Off: such turns start a new row from the template's
    rendering (see docs/gateway.md, Model families)."""
    allow_uncertified_template: bool = False
    """Train even when the chat template does not certify (``python -m core.gateway certify``:
    a recorded trace would differ from what the template renders). Off: ``python -m
    core.train`` refuses such a template at start, naming the failing case."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments for ``apply_chat_template`` (e.g. ``enable_thinking: false``)."""
    max_body_bytes: int = 8_000_000
    """Largest request body accepted (413 beyond)."""
    max_admin_body_bytes: int = 1_000_000
    """Largest admin request body accepted, session ``metadata`` included (413 beyond)."""
    body_read_timeout_s: float = 30.0
    """Seconds a client may take to send the rest of its request body once the server
    starts reading it (a total deadline, not an idle one: raise it for multi-MB bodies
    over slow links); then 408 and the connection is closed, so a slow or idle client no
    longer holds it forever. 0 means no limit."""
    header_read_timeout_s: float = 30.0
    """Seconds a connection may take to send a request's headers (from connecting, or from
    the request's first byte); then it is closed and a warning logged. 0 means no limit."""
    keep_alive_timeout_s: int = 30
    """Seconds an idle keep-alive connection stays open between requests."""
    max_connections: int = 2048
    """Open connections (and requests) the server accepts at once; beyond it new requests get
    503 and a warning is logged. Connections still sending their request headers do not
    count (``max_pending_headers_per_client`` bounds those). 0 means no cap."""
    max_pending_headers_per_client: int = 64
    """Connections one client address may hold while they still send their request headers;
    beyond it that address's oldest such connections (those older than
    ``pending_headers_grace_s``) are closed, so half-sent headers on thousands of connections
    cannot crowd out the agents. 0 means no cap."""
    pending_headers_grace_s: float = 10.0
    """Age under which a connection still sending its headers is never closed for
    ``max_pending_headers_per_client``. Local agents all share one address (127.0.0.1), and on
    a loaded machine a burst of them can wait seconds before the gateway's loop reads their
    headers: they are not an attack, so only connections pending longer than this are."""
    max_turns_per_session: int = 1024
    """Turns one session may record; further requests get 400 ``session_turn_limit``. Bounds a
    session's memory to about this many turns of ``max_context_tokens``. 0 means no cap."""
    max_stop_strings: int = 32
    """Stop strings one request may add (``stop`` / ``stop_sequences``); more is a 400."""
    render_offload_chars: int = 65_536
    """Renders at least this large (request bytes, or tail characters) run in a worker thread,
    so a huge prompt slows only its own request; smaller turns render inline (faster)."""
    allow_sampling_overrides: bool = False
    """Let requests set temperature/top_p/top_k. Off for training: the session's values
    win so the trainer knows the distribution its logprobs came from (max_tokens may
    always be lowered and stop strings always added; each turn's params are recorded)."""
    ignore_request_fields: list[str] = field(default_factory=list)
    """Top-level request fields dropped before a request is read, on every route (chat,
    messages, Responses): the escape hatch for a client that sends a field the gateway does
    not know (refused with a 400 by default, since it might change what the model produces)
    or cannot honour. The gateway then acts as if it had not been sent; list only fields
    you know do not matter for what you train (docs/gateway.md, Request fields)."""
    admin_token: str = ""
    """Token the admin routes require; empty generates a random one at start."""
    shards: int | str = 1
    """Gateway processes sessions are spread over (docs/scale.md). 1: the gateway runs in
    the trainer's process, as always. More: that many processes on this machine, each
    owning its sessions, rows collected by the trainer as from one; they need a sampler
    each can call (``sampler=vllm|sglang``). ``per_node`` (``runtime=ray`` only): one
    gateway process on each Ray node that hosts agents, serving that node's agents."""

    def __post_init__(self) -> None:
        from core.errors import ConfigError

        limits = {
            "max_context_tokens": self.max_context_tokens,
            "max_body_bytes": self.max_body_bytes,
            "max_admin_body_bytes": self.max_admin_body_bytes,
            "body_read_timeout_s": self.body_read_timeout_s,
            "header_read_timeout_s": self.header_read_timeout_s,
            "keep_alive_timeout_s": self.keep_alive_timeout_s,
            "max_connections": self.max_connections,
            "max_pending_headers_per_client": self.max_pending_headers_per_client,
            "pending_headers_grace_s": self.pending_headers_grace_s,
            "max_turns_per_session": self.max_turns_per_session,
            "max_stop_strings": self.max_stop_strings,
            "render_offload_chars": self.render_offload_chars,
        }
        if not isinstance(self.ignore_request_fields, list | tuple) or not all(
            isinstance(f, str) and f for f in self.ignore_request_fields
        ):
            raise ConfigError(
                f"gateway.ignore_request_fields must be a list of field names, got {self.ignore_request_fields!r}"
            )
        owned = sorted({"messages", "input", "max_tokens"} & set(self.ignore_request_fields))
        if owned:
            raise ConfigError(f"gateway.ignore_request_fields may not drop {owned}: a request cannot be read without them")
        if self.shards != SHARDS_PER_NODE and (
            not isinstance(self.shards, int) or isinstance(self.shards, bool) or self.shards < 1
        ):
            raise ConfigError(
                f"gateway.shards must be an integer >= 1 (1: no shards) or {SHARDS_PER_NODE!r} "
                f"(runtime=ray: one gateway per Ray node), got {self.shards!r}"
            )
        negative = {k: v for k, v in limits.items() if v < 0}
        if negative:
            raise ConfigError(
                f"gateway settings must not be negative, got {negative}; "
                "use 0 where a setting documents 0 as 'no limit'"
            )

"""Config schema of the gateway section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    """Tool-call parser: auto, hermes (Qwen3 JSON), qwen3_coder (XML), llama3_json, none."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments for ``apply_chat_template`` (e.g. ``enable_thinking: false``)."""
    max_body_bytes: int = 8_000_000
    """Largest request body accepted (413 beyond)."""
    allow_sampling_overrides: bool = False
    """Let requests set temperature/top_p/top_k. Off for training: the session's values
    win so the trainer knows the distribution its logprobs came from (max_tokens may
    always be lowered and stop strings always added; each turn's params are recorded)."""
    admin_token: str = ""
    """Token the admin routes require; empty generates a random one at start."""

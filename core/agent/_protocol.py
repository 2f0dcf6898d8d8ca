"""Wire formats shared by the agent app and the runtimes that call it.

Defines:

- ``SESSION_HEADER``: the AgentCore Runtime session header.
- ``ENVELOPE_KEY`` / ``InvocationOp``: the start/get envelope of agentcore-rl-toolkit's
  ``AgentCoreRuntimeApp`` (``_agentcore_runtime``), plus tracerl's additive ``cancel``
  operation and ``wait_s`` long-poll field (understood only by ``core.agent.AgentApp``).
- ``invocation_state``: the state object a start/get answers with.
- ``ModelConfig``: the model settings an agent finds in its payload, read from either
  of the toolkit's shapes (``_config`` or ``_rollout``).
- ``S3_FIELDS`` / ``s3_result_key``: the S3 result channel of ``AgentCoreRLApp``.

Nothing here imports more than the standard library: agent containers stay small.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
"""Header carrying the runtime session id (one rollout = one session)."""

ENVELOPE_KEY = "_agentcore_runtime"
"""Reserved payload key of the start/get invocation protocol."""

CONFIG_KEY = "_config"
"""Reserved payload key with the model config (``AgentCoreRuntimeApp`` shape)."""

ROLLOUT_KEY = "_rollout"
"""Reserved payload key with the model config and S3 fields (``AgentCoreRLApp`` shape)."""

PROTOCOL_VERSION = 1
"""Version of the start/get envelope; the toolkit accepts only 1."""

S3_FIELDS = ("exp_id", "input_id", "s3_bucket")
"""``_rollout`` fields that turn on the S3 result channel; all three or none."""

SERVER_MARKER = "tracerl"
"""Key our app adds to invocation states so a runtime knows it may long-poll and cancel."""

InvocationStatus = Literal["in_progress", "completed", "interrupted", "not_found"]

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_ENVELOPE_FIELDS = {"version", "operation", "invocation_id", "background", "wait_s"}


@dataclass(frozen=True)
class InvocationOp:
    """One parsed ``_agentcore_runtime`` envelope."""

    operation: Literal["start", "get", "cancel"]
    """What to do with the invocation."""
    invocation_id: str
    """Caller-chosen id, unique within the session."""
    background: bool = False
    """For ``start``: answer at once (True) or when the handler is done (False)."""
    wait_s: float = 0.0
    """For ``get`` (tracerl extension): wait up to this long for completion before answering."""

    @classmethod
    def parse(cls, envelope: Any) -> InvocationOp:
        """Validate an envelope the way the toolkit does, plus tracerl's extensions.

        Raises:
            ValueError: the envelope is malformed; the message names the field.
        """
        if not isinstance(envelope, dict):
            raise ValueError(f"{ENVELOPE_KEY} must be an object, got {type(envelope).__name__}")
        unknown = set(envelope) - _ENVELOPE_FIELDS
        if unknown:
            raise ValueError(f"{ENVELOPE_KEY} has unknown fields {sorted(unknown)!r}")
        version = envelope.get("version")
        if isinstance(version, bool) or version != PROTOCOL_VERSION:
            raise ValueError(f"{ENVELOPE_KEY}.version must be {PROTOCOL_VERSION}, got {version!r}")
        operation = envelope.get("operation")
        if operation not in ("start", "get", "cancel"):
            raise ValueError(
                f"{ENVELOPE_KEY}.operation must be 'start', 'get' or 'cancel', got {operation!r}"
            )
        invocation_id = envelope.get("invocation_id")
        if not isinstance(invocation_id, str) or not _ID_RE.fullmatch(invocation_id):
            raise ValueError(
                f"{ENVELOPE_KEY}.invocation_id must be 1-128 letters, digits, '_' or '-' "
                f"starting alphanumeric, got {invocation_id!r}"
            )
        background = envelope.get("background", False)
        if not isinstance(background, bool):
            raise ValueError(f"{ENVELOPE_KEY}.background must be a boolean, got {background!r}")
        if operation != "start" and "background" in envelope:
            raise ValueError(f"{ENVELOPE_KEY}.background is only valid for 'start'")
        wait_s = envelope.get("wait_s", 0.0)
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 <= wait_s <= 60:
            raise ValueError(f"{ENVELOPE_KEY}.wait_s must be a number in [0, 60], got {wait_s!r}")
        return cls(operation, invocation_id, background, float(wait_s))

    def to_envelope(self) -> dict[str, Any]:
        """The wire form, omitting fields the toolkit would reject for this operation."""
        env: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "operation": self.operation,
            "invocation_id": self.invocation_id,
        }
        if self.operation == "start":
            env["background"] = self.background
        if self.wait_s:
            env["wait_s"] = self.wait_s
        return env


def invocation_state(invocation_id: str, status: InvocationStatus, **extra: Any) -> dict[str, Any]:
    """A start/get answer: ``{version, invocation_id, status, result? | error?}``."""
    return {"version": PROTOCOL_VERSION, "invocation_id": invocation_id, "status": status, **extra}


@dataclass(frozen=True)
class ModelConfig:
    """Where and how an agent should call the model during a rollout.

    Example:
        >>> cfg = ModelConfig.from_payload(payload)
        >>> client = shared_client.with_options(api_key=cfg.api_key)  # one pool per process
    """

    base_url: str
    """OpenAI-style base URL of the gateway (ends in ``/v1``)."""
    model_id: str
    """Model name to pass in requests."""
    api_key: str
    """The gateway session id; the gateway files every turn under it."""
    sampling_params: dict[str, Any] = field(default_factory=dict)
    """Sampling settings the trainer wants forwarded (temperature, max_tokens, ...)."""

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> ModelConfig:
        """Read ``_config`` (preferred) or ``_rollout``; fields in ``_config`` win.

        Raises:
            ValueError: neither shape carries a ``base_url``; the message says what to send.
        """
        merged: dict[str, Any] = {}
        for key in (ROLLOUT_KEY, CONFIG_KEY):
            part = payload.get(key)
            if isinstance(part, dict):
                merged.update({k: v for k, v in part.items() if v is not None})
        base_url = merged.get("base_url")
        if not isinstance(base_url, str) or not base_url:
            raise ValueError(
                f"payload has no model base_url under {CONFIG_KEY!r} or {ROLLOUT_KEY!r} "
                f"(keys: {sorted(payload)!r}); the runtime must send "
                f"{{'{CONFIG_KEY}': {{'base_url', 'model_id', 'api_key'}}}}"
            )
        sampling = merged.get("sampling_params") or {}
        return cls(
            base_url=base_url,
            model_id=str(merged.get("model_id") or "default"),
            api_key=str(merged.get("api_key") or "EMPTY"),
            sampling_params=dict(sampling) if isinstance(sampling, dict) else {},
        )


def s3_config(payload: dict[str, Any]) -> dict[str, str] | None:
    """The S3 fields of a ``_rollout`` payload, or None when the S3 channel is off.

    Raises:
        ValueError: some but not all of ``S3_FIELDS`` are present.
    """
    rollout = payload.get(ROLLOUT_KEY)
    if not isinstance(rollout, dict) or not any(f in rollout for f in S3_FIELDS):
        return None
    missing = [f for f in S3_FIELDS if not isinstance(rollout.get(f), str) or not rollout.get(f)]
    if missing:
        raise ValueError(
            f"{ROLLOUT_KEY} turns on the S3 channel but lacks {missing!r}; "
            f"send all of {list(S3_FIELDS)!r} or none"
        )
    return {f: rollout[f] for f in S3_FIELDS}


def s3_result_key(exp_id: str, input_id: str, session_id: str) -> str:
    """Object key of a rollout's result, the toolkit's layout.

    ``session_id`` is the one the agent sees in ``SESSION_HEADER``: runtimes send
    ``result_session_id`` of the gateway session there, never the bearer token itself.
    """
    return f"{exp_id}/{input_id}/{session_id}.json"


def result_session_id(gateway_session_id: str) -> str:
    """The session id an S3-channel agent is given (and its result key is named by):
    the SHA-256 of the gateway session id (64 hex characters, stable per session).

    The gateway session id is a bearer token; anyone who can list the result bucket
    (or read AgentCore's session logs) would otherwise hold every rollout's token.
    """
    return hashlib.sha256(gateway_session_id.encode()).hexdigest()

"""Errors the gateway answers with, and their two wire envelopes.

Defines:

- ``GatewayError``: an HTTP-visible failure (status, OpenAI ``type``/``code``,
  the offending ``param``), raised anywhere in the gateway and turned into a
  response in exactly one place (``core.gateway.app``).
- Constructors for the cases the gateway distinguishes: ``bad_request``,
  ``unauthorized``, ``session_closed``, ``forbidden``, ``not_found``,
  ``too_large``, ``context_length_exceeded``, ``sampler_failed``,
  ``generation_aborted``.
- ``openai_envelope`` / ``anthropic_envelope``: the JSON bodies each SDK parses.
"""

from __future__ import annotations

from typing import Any

from core.errors import TracerlError

__all__ = [
    "SURROGATE_HINT",
    "GatewayError",
    "anthropic_envelope",
    "bad_request",
    "context_length_exceeded",
    "forbidden",
    "generation_aborted",
    "not_found",
    "openai_envelope",
    "request_timeout",
    "sampler_failed",
    "session_closed",
    "too_large",
    "unauthorized",
]

# Anthropic's error ``type`` for each status it documents; anything else is an api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


SURROGATE_HINT = (
    "holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair), which is not valid "
    "Unicode; send valid text (escaped pairs such as \\ud83d\\ude00 are fine)"
)
"""The end of a 400 message about a lone surrogate, after the field's name."""


class GatewayError(TracerlError, ValueError):
    """A request the gateway refuses or could not serve; carries its HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.message, self.status, self.type, self.code, self.param))


def _rebuild(message: str, status: int, type: str, code: str | None, param: str | None) -> GatewayError:
    return GatewayError(message, status=status, type=type, code=code, param=param)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    """400: the body is malformed, has wrong types or asks for something unsupported."""
    return GatewayError(message, status=400, param=param, code=code)


def unauthorized(message: str) -> GatewayError:
    """401: no session id, or one this gateway never issued (or already dropped)."""
    return GatewayError(message, status=401, type="authentication_error", code="invalid_api_key")


def forbidden(message: str) -> GatewayError:
    """403: an admin route called with a wrong admin token."""
    return GatewayError(message, status=403, type="permission_error", code="invalid_admin_token")


def session_closed(message: str) -> GatewayError:
    """409: the session exists but was finished; its trace is already handed over."""
    return GatewayError(message, status=409, type="invalid_request_error", code="session_closed")


def not_found(message: str) -> GatewayError:
    """404: no such route or resource."""
    return GatewayError(message, status=404, type="not_found_error", code="not_found")


def too_large(limit: int, key: str = "gateway.max_body_bytes") -> GatewayError:
    """413: the body is larger than the limit ``key`` (``GatewayConfig.max_body_bytes`` by default)."""
    return GatewayError(
        f"request body exceeds the gateway limit of {limit} bytes "
        f"(raise {key} if such requests are legitimate)",
        status=413,
        type="invalid_request_error",
        code="request_too_large",
    )


def request_timeout(message: str) -> GatewayError:
    """408: the client did not send its request body in time."""
    return GatewayError(message, status=408, type="invalid_request_error", code="request_timeout")


GATEWAY_BUDGET = "gateway.max_context_tokens (or the budget the session was opened with)"
"""Where the gateway's own context budget comes from, for ``context_length_exceeded``."""


def context_length_exceeded(
    prompt_tokens: int, budget: int, *, at_least: bool = False, setting: str = GATEWAY_BUDGET
) -> GatewayError:
    """400 ``context_length_exceeded`` in OpenAI's wording (LiteLLM and agents key on it),
    then which setting holds the limit and what to change.

    ``at_least``: ``prompt_tokens`` is a lower bound (the prompt was refused
    from its length before it was tokenized, see ``ChatRenderer.min_tokens``).
    ``setting``: where ``budget`` comes from (the gateway's budget, or the model's
    context as the sampler names it).
    """
    counted = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
    return GatewayError(
        f"This model's maximum context length is {budget} tokens. However, your messages "
        f"resulted in {counted} tokens. Please reduce the length of the messages. "
        f"(tracerl: the limit of {budget} is {setting}; raise it, or shorten the agent's prompt "
        "and history: each turn adds up to algorithm.max_tokens generated tokens)",
        status=400,
        type="invalid_request_error",
        code="context_length_exceeded",
        param="messages",
    )


def sampler_failed(message: str) -> GatewayError:
    """503: the sampling backend failed; clients may retry."""
    return GatewayError(message, status=503, type="server_error", code="sampler_error")


def generation_aborted(message: str) -> GatewayError:
    """503: the sampler aborted the generation (weights swapped, shutdown); retry.

    Not a 200 with ``finish_reason`` ``stop``: the text is cut short and was never
    a finished turn, and an error status is what both SDKs surface (and retry).
    """
    return GatewayError(message, status=503, type="server_error", code="generation_aborted")


def openai_envelope(err: GatewayError) -> dict[str, Any]:
    """OpenAI's ``{"error": {message, type, param, code}}`` body."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def anthropic_envelope(err: GatewayError) -> dict[str, Any]:
    """Anthropic's ``{"type": "error", "error": {type, message}}`` body."""
    kind = _ANTHROPIC_TYPES.get(err.status, "api_error")
    message = err.message
    if err.code == "context_length_exceeded":
        # Anthropic phrases overflow as "prompt is too long"; keep both wordings
        # so clients keyed on either recognise it.
        message = f"prompt is too long: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}

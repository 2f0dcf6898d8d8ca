"""Differences between Tinker-API servers that the SDK (0.38) does not absorb.

Found against SkyRL tx 0.4.0 (the ``skyrl`` test tier, docs/backends/tinker.md);
each is harmless against Thinking Machines' service, where the first branch of
every helper is the one taken.

- ``loss_from_outputs``: a server may report no loss metric but per-token
  ``elementwise_loss`` in each datum's output (SkyRL tx: ``metrics={}``).
- ``allow_missing_sequence_ids``: SDK 0.38 refuses a sample whose submission
  carried no ``sample_sequence_ids`` (servers written for SDK < 0.25 send none).
- ``is_refusal``: whether a failed call was the server refusing the request's
  shape (HTTP 400/404/422), e.g. SDK 0.38's session-scoped ``load_weights``
  for ``create_training_client_from_state_with_optimizer``, which SkyRL tx
  0.4.0 rejects for its missing ``model_id``; the backend then falls back to
  the per-model request the older SDKs sent.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

_PATCHED = "_tracerl_allows_missing_ids"


def loss_from_outputs(outputs: Any) -> float | None:
    """Sum of every datum's ``elementwise_loss`` (Tinker's ``loss:sum``), or None if absent."""
    total = 0.0
    found = False
    for item in outputs or []:
        tensor = item.get("elementwise_loss") if isinstance(item, dict) else None
        if tensor is None:
            continue
        values = tensor.tolist() if hasattr(tensor, "tolist") else list(getattr(tensor, "data", tensor))
        total += math.fsum(float(x) for x in values)
        found = True
    return total if found else None


def allow_missing_sequence_ids() -> None:
    """Let SDK 0.38 accept samples from servers that assign no sequence ids (idempotent).

    The SDK stamps the ids of the ``asample`` promise onto each returned
    ``SampledSequence`` and asserts they exist; tracerl never reads them. When
    a promise carries none, fresh ids are stamped instead. Does nothing on SDK
    versions without that step.
    """
    try:
        from tinker.lib.public_interfaces import sampling_client
    except ImportError:  # pragma: no cover - another SDK layout
        return
    original = getattr(sampling_client, "_attach_sequence_ids", None)
    if original is None or getattr(original, _PATCHED, False):
        return

    def attach(response: Any, sample_sequence_ids: list[str] | None) -> Any:
        if sample_sequence_ids is None:
            sample_sequence_ids = [f"tracerl-{uuid.uuid4().hex}" for _ in response.sequences]
        return original(response, sample_sequence_ids)

    setattr(attach, _PATCHED, True)
    sampling_client._attach_sequence_ids = attach


def status_code(exc: BaseException | None) -> int | None:
    """The HTTP status of the SDK error behind ``exc`` (following ``__cause__``), if any."""
    seen = 0
    while exc is not None and seen < 10:
        code = getattr(exc, "status_code", None)
        if isinstance(code, int):
            return code
        exc = exc.__cause__
        seen += 1
    return None


def is_refusal(exc: BaseException) -> bool:
    """Whether the server refused the request itself (400, 404 or 422), not failed on it."""
    return status_code(exc) in (400, 404, 422)

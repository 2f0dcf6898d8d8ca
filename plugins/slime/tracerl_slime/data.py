"""tracerl payloads -> slime's ``--prompt-data`` JSONL.

Defines ``slime_row`` and ``write_slime_dataset``. Each line is
``{"prompt": str, "label": str, "metadata": {"tracerl_payload": payload}}``:
slime reads ``prompt`` (``--input-key``) and ``label`` (``--label-key``) for
its logs and length filter, and copies ``metadata`` (``--metadata-key``)
onto every ``Sample``, where ``tracerl_slime.generate`` finds the payload.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROMPT_CHARS = 2000
"""Longest ``prompt`` text written (slime only logs it and checks its length)."""


def slime_row(payload: dict[str, Any]) -> dict[str, Any]:
    """One JSONL row for ``payload`` (payload ``prompt``/``answer`` shown when present)."""
    prompt = payload.get("prompt")
    text = prompt if isinstance(prompt, str) else json.dumps(payload, sort_keys=True, default=str)
    label = payload.get("answer", payload.get("label", ""))
    return {
        "prompt": text[:PROMPT_CHARS],
        "label": "" if label is None else str(label),
        "metadata": {"tracerl_payload": payload},
    }


def write_slime_dataset(payloads: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write ``payloads`` as slime prompt data at ``path``; returns ``path``.

    Raises:
        ValueError: a payload that is not a JSON object or does not serialise.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, payload in enumerate(payloads):
            if not isinstance(payload, dict):
                raise ValueError(f"payload {i} must be a JSON object, got {type(payload).__name__}")
            try:
                f.write(json.dumps(slime_row(payload), ensure_ascii=False) + "\n")
            except TypeError as exc:
                raise ValueError(f"payload {i} is not JSON-serialisable: {exc}") from exc
    return path

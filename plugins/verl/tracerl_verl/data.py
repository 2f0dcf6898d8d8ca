"""tracerl ``payload`` data sets -> the Parquet rows verl's ``RLHFDataset`` reads.

Defines ``write_verl_dataset``. verl's dataset needs a chat ``prompt`` column
(it builds ``raw_prompt`` from it), ``data_source`` and
``reward_model.ground_truth`` (read by its reward manager, which our loop
bypasses by setting the reward itself) and ``extra_info.index``. The payload
travels as a JSON string in ``tracerl_payload`` (payloads of one data set may
have different keys, which a Parquet struct column cannot hold), and
``agent_name`` routes every row to our loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError

PROMPT_PREVIEW_CHARS = 200
"""How much of the payload the placeholder ``prompt`` shows (verl logs it; the agent
renders its own prompt through the gateway)."""


def verl_rows(
    payloads: Sequence[dict[str, Any]], *, agent_name: str, data_source: str = "tracerl"
) -> list[dict[str, Any]]:
    """One verl dataset row per payload (see the module docstring)."""
    rows = []
    for i, payload in enumerate(payloads):
        try:
            text = json.dumps(payload, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"payload {i} is not JSON-serialisable ({exc}); payloads must be plain JSON"
            ) from exc
        rows.append(
            {
                "prompt": [{"role": "user", "content": text[:PROMPT_PREVIEW_CHARS]}],
                "data_source": data_source,
                "reward_model": {"style": "agent", "ground_truth": ""},
                "extra_info": {"index": i},
                "agent_name": agent_name,
                "tracerl_payload": text,
            }
        )
    return rows


def write_verl_dataset(
    payloads: Sequence[dict[str, Any]], path: str | Path, *, agent_name: str
) -> Path:
    """Write ``payloads`` as verl Parquet at ``path``; returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not payloads:
        raise ConfigError(f"no payloads to write to {str(path)!r}; the task's data set is empty")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(verl_rows(payloads, agent_name=agent_name)), path)
    return path

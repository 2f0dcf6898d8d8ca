"""Turning a ``TraceRecord`` row into a training ``Datum``."""

from __future__ import annotations

from core.types import Datum, TraceRecord


def trace_to_datum(record: TraceRecord, advantage: float) -> Datum | None:
    """Shift the row by one token (Tinker's convention) and spread the advantage over
    the generated tokens.

    Returns None for a row with nothing to train (no generated token, or a
    single token: there is no context to predict it from).
    """
    if len(record.token_ids) < 2 or not any(record.loss_mask[1:]):
        return None
    weights = [float(m) for m in record.loss_mask[1:]]
    return Datum(
        model_input=list(record.token_ids[:-1]),
        target_tokens=list(record.token_ids[1:]),
        logprobs=[float(lp) for lp in record.logprobs[1:]],
        advantages=[advantage * w for w in weights],
        weights=weights,
    )

"""Evaluation: ``python -m core.eval`` and the training loop's periodic eval (docs/eval.md).

``run_eval`` runs an eval set through a runner (the gateway's ``RolloutRunner``
or ``EndpointRunner``); ``summarize`` computes mean reward, pass@k, mean@k,
failures and tokens; ``compare_rows`` diffs two results files per prompt.
"""

from __future__ import annotations

from core.eval.compare import compare_rows
from core.eval.config import EvalConfig
from core.eval.results import EvalRow, k_values, pass_at_k, read_rows, summarize, write_rows
from core.eval.run import EndpointRunner, eval_metrics, outcome_row, run_eval

__all__ = [
    "EndpointRunner",
    "EvalConfig",
    "EvalRow",
    "compare_rows",
    "eval_metrics",
    "k_values",
    "outcome_row",
    "pass_at_k",
    "read_rows",
    "run_eval",
    "summarize",
    "write_rows",
]

"""A stored training step whose turns come from two policies (#34), for the viewer tests.

Written with the real trace writer from rows laid out by hand (the gateway's side, which
policy a turn gets and that a change of policy starts a new row, is tested in
tests/gateway): a rollout whose planner turn is followed by a coder turn (two rows), one
with two planner turns, and one with a coder turn.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.rundir.traces import TraceWriter
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)

POLICIES = {
    "r-both": ["planner", "coder"],
    "r-planner": ["planner", "planner"],
    "r-coder": ["coder"],
}
"""Each rollout's turns' policies, in order."""


def _row(rid: str, index: int, policies: list[str]) -> TraceRecord:
    ids, spans = list(range(10, 20)), []
    for k, _ in enumerate(policies):
        start = len(ids)
        ids += list(range(30 + 10 * k, 36 + 10 * k))
        spans.append(TurnSpan(start, len(ids), FinishReason.STOP, 1, policy=policies[k]))
        ids += [20, 21]
    ids = ids[:-2]
    mask = [0] * len(ids)
    for span in spans:
        mask[span.start : span.end] = [1] * (span.end - span.start)
    return TraceRecord(f"tr-{rid}", ids, mask, [-0.5 * m for m in mask], 10, spans, row_index=index, metadata={"shared_turns": 0})


def _outcome(rid: str, policies: list[str]) -> Any:
    # A row never mixes policies: consecutive turns of one policy share a row.
    runs: list[list[str]] = []
    for policy in policies:
        if runs and runs[-1][0] == policy:
            runs[-1].append(policy)
        else:
            runs.append([policy])
    conversation: list[dict[str, Any]] = [{"parent": -1, "messages": [{"role": "user", "content": "plan it"}], "turn": None}]
    for k, policy in enumerate(policies):
        conversation.append({
            "parent": len(conversation) - 1, "messages": [{"role": "assistant", "content": f"{policy} says {k + 1}"}],
            "turn": k, "weight_version": 1, "finish_reason": "stop", "parse": "no_tools", "policy": policy,
        })
    return SimpleNamespace(
        request=RolloutRequest(rid, "g0", {"q": "plan it"}, "http://x/v1", f"tr-{rid}", "m"),
        result=RolloutResult(rid, RolloutStatus.OK, reward=0.5, elapsed_s=1.0),
        rows=[_row(rid, i, run) for i, run in enumerate(runs)], faults={"model_turns": len(policies)},
        conversation=conversation,
    )


def write_policy_step(run_dir: Path, step: int = 1) -> None:
    """Store ``POLICIES``'s rollouts as training step ``step`` of ``run_dir``."""
    outcomes = [_outcome(rid, policies) for rid, policies in POLICIES.items()]
    TraceWriter(run_dir, 1, decode=lambda ids: f"t{ids[0]} ").write_step(step, outcomes, {}, weight_version=1)
    (run_dir / "metrics.jsonl").touch()

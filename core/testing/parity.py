"""One batch every backend must train the same way, and what "the same way" means.

Core's loop, the verl agent loop and slime's generate function each turn
finished rollouts into training signal. They must agree on the awkward
cases, so each backend's test tier runs ``parity_batch()`` through its own
translation and compares the per-token advantages with
``expected_token_advantages()``, the specification written out here
independently of any backend's code.

The batch, as ``RolloutRunner.run_one`` hands it on (statuses classified):

- ``normal``: three scored rollouts, rewards 1.0, 0.0 and 0.5;
- ``survivor``: one scored rollout beside a timeout and a crash (a lone
  survivor has no baseline: advantage 0, never "mean 0, std 1");
- ``constant``: three rollouts that all scored 1.0 (no signal: advantage 0);
- ``forked``: two rollouts, one of which forked into two rows; a rollout counts
  once in its group however many rows it has, and each row's generated tokens
  get the rollout's advantage;
- ``broken``: two scored rollouts, one whose model call failed in the gateway
  (``sampler_error``: never trained, not in the baseline) and one that returned
  a reward without calling the model (``no_model_calls``: no rows, not in the
  baseline).

The rule: a rollout trains only with status ``ok``; its group baseline is the
mean over the group's ``ok`` rollouts; groups with fewer than two of them, or
with equal rewards, give advantage 0; otherwise ``(r - mean) / (std + eps)``,
with the population standard deviation (core's default) or the sample one
(verl's GRPO) as a named, documented switch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)

StdKind = Literal["population", "sample"]


@dataclass
class ParityRollout:
    """One finished rollout of the parity batch, as the runner returns it."""

    request: RolloutRequest
    result: RolloutResult
    rows: list[TraceRecord]

    @property
    def ok(self) -> bool:
        return self.result.status is RolloutStatus.OK


@dataclass
class RowSpec:
    """A row to build: ``prompt``, then each generated turn followed by its tool result."""

    prompt: list[int]
    turns: list[list[int]]
    tools: list[list[int]] = field(default_factory=list)


def _row(request: RolloutRequest, result: RolloutResult, *, index: int, spec: RowSpec) -> TraceRecord:
    """Build one row of ``spec`` for ``request``'s rollout, which ended as ``result``; tool
    results and the prompt are not trained."""
    prompt, turns, tools = spec.prompt, spec.turns, spec.tools
    ids = list(prompt)
    mask = [0] * len(prompt)
    logprobs = [0.0] * len(prompt)
    spans: list[TurnSpan] = []
    for t, turn in enumerate(turns):
        start = len(ids)
        ids += turn
        mask += [1] * len(turn)
        logprobs += [-0.1 * (k + 1) for k in range(len(turn))]
        spans.append(TurnSpan(start, len(ids), FinishReason.STOP, 0))
        if tools and t < len(tools):
            ids += tools[t]
            mask += [0] * len(tools[t])
            logprobs += [0.0] * len(tools[t])
    row = TraceRecord(
        session_id=request.session_id,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=len(prompt),
        turns=spans,
        row_index=index,
        rollout_id=request.rollout_id,
        group_id=request.group_id,
        reward=result.reward,
        status=result.status,
        metadata={"turns": len(turns), "forks": 0},
    )
    row.validate()
    return row


def _rollout(rollout_id: str, group_id: str, status: RolloutStatus, reward: float | None,
             rows: list[RowSpec]) -> ParityRollout:
    sid = f"sess-{rollout_id}"
    request = RolloutRequest(
        rollout_id=rollout_id,
        group_id=group_id,
        payload={"group": group_id},
        base_url="http://127.0.0.1:0/v1",
        session_id=sid,
        model_id="parity",
    )
    result = RolloutResult(
        rollout_id=rollout_id,
        status=status,
        reward=reward if status is RolloutStatus.OK else None,
        error=None if status is RolloutStatus.OK else f"parity fixture: {status.value}",
    )
    built = [
        _row(request, result, index=i, spec=spec) for i, spec in enumerate(rows)
    ]
    if len(built) > 1:
        for row in built:
            row.metadata["forks"] = len(built) - 1
    return ParityRollout(request=request, result=result, rows=built)


def parity_batch() -> list[ParityRollout]:
    """The fixture batch (see the module docstring), in a fixed order."""
    ok, p = RolloutStatus.OK, [1, 2, 3, 4]
    single = [RowSpec(p, [[10, 11, 2]])]
    two_turns = [RowSpec(p, [[12, 13], [14, 2]], [[5, 6, 7]])]
    return [
        _rollout("normal-0", "normal", ok, 1.0, two_turns),
        _rollout("normal-1", "normal", ok, 0.0, single),
        _rollout("normal-2", "normal", ok, 0.5, single),
        _rollout("survivor-0", "survivor", ok, 1.0, single),
        _rollout("survivor-1", "survivor", RolloutStatus.TIMEOUT, None, single),
        _rollout("survivor-2", "survivor", RolloutStatus.CRASHED, None, []),
        _rollout("constant-0", "constant", ok, 1.0, single),
        _rollout("constant-1", "constant", ok, 1.0, single),
        _rollout("constant-2", "constant", ok, 1.0, two_turns),
        # Forked: the first row holds the shared turn, the second the branch taken after a
        # history rewrite; the shared turn is trained once (masked in the second row).
        _rollout("forked-0", "forked", ok, 1.0, [
            RowSpec(p, [[20, 21]], [[5, 6]]),
            RowSpec(p + [20, 21, 8, 9], [[22, 23, 2]]),
        ]),
        _rollout("forked-1", "forked", ok, 0.0, single),
        _rollout("broken-0", "broken", ok, 1.0, single),
        _rollout("broken-1", "broken", ok, 0.0, single),
        _rollout("broken-2", "broken", RolloutStatus.SAMPLER_ERROR, None, single),
        _rollout("broken-3", "broken", RolloutStatus.NO_MODEL_CALLS, None, []),
    ]


def expected_advantages(
    batch: list[ParityRollout], *, std: StdKind = "population", eps: float = 1e-4,
    normalize_std: bool = True,
) -> dict[str, float | None]:
    """Advantage per rollout id under the rule above; None for rollouts that never train."""
    groups: dict[str, list[ParityRollout]] = {}
    for r in batch:
        groups.setdefault(r.request.group_id, []).append(r)
    out: dict[str, float | None] = {}
    for members in groups.values():
        scored = [m for m in members if m.ok]
        rewards = [float(m.result.reward) for m in scored]  # type: ignore[arg-type]
        for m in members:
            out[m.request.rollout_id] = None
        if not scored:
            continue
        mean = sum(rewards) / len(rewards)
        n = len(rewards)
        if n < 2 or max(rewards) - min(rewards) <= 1e-12:
            for m in scored:
                out[m.request.rollout_id] = 0.0
            continue
        denom = n if std == "population" else n - 1
        scale = math.sqrt(sum((x - mean) ** 2 for x in rewards) / denom) + eps if normalize_std else 1.0
        for m, reward in zip(scored, rewards, strict=True):
            out[m.request.rollout_id] = (reward - mean) / scale
    return out


def expected_token_advantages(
    batch: list[ParityRollout], *, std: StdKind = "population", eps: float = 1e-4,
    normalize_std: bool = True,
) -> dict[tuple[str, int], list[float]]:
    """Per-token advantage of every trained row, keyed by ``(rollout_id, row_index)``.

    A row's entry is aligned with its ``token_ids``: the rollout's advantage on
    generated tokens (``loss_mask`` 1), 0.0 elsewhere. Rollouts that never train
    have no entry.
    """
    adv = expected_advantages(batch, std=std, eps=eps, normalize_std=normalize_std)
    out: dict[tuple[str, int], list[float]] = {}
    for r in batch:
        a = adv[r.request.rollout_id]
        if a is None:
            continue
        for row in r.rows:
            out[(r.request.rollout_id, row.row_index)] = [a * m for m in row.loss_mask]
    return out

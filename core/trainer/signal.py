"""A step's finished rollouts turned into the datums ``forward_backward`` gets.

Factored out of the loop so the parity test (``core.testing.parity``) runs the
loop's own translation. Rollouts are anything with ``request`` (``rollout_id``,
``group_id``), ``result`` (``status``, ``reward``) and ``rows``, as
``RolloutOutcome`` has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.algo import RolloutScore, compute_group_advantages, trace_to_datum
from core.types import Datum, RolloutStatus

TOKEN_MEAN_OVER = ("batch", "trained")
"""``algorithm.token_mean_over`` choices."""


@dataclass
class StepSignal:
    """What one step trains on."""

    datums: list[Datum] = field(default_factory=list)
    """In rollout order, then row order."""
    sources: list[tuple[str, int]] = field(default_factory=list)
    """``(rollout_id, row_index)`` of each datum."""
    advantages: dict[str, float] = field(default_factory=dict)
    """Advantage of every rollout that trains (0.0 for lone and constant groups)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``groups/*`` and ``rollouts/excluded_failed``."""

    @property
    def has_signal(self) -> bool:
        """True when some trained token has a non-zero advantage; a step without one
        must not call ``optim_step`` (Adam's momentum would still move the weights)."""
        return any(a != 0.0 for d in self.datums for a in d.advantages)


def build_signal(
    outcomes: Sequence[Any],
    *,
    normalize_std: bool = True,
    exclude_failed: bool = True,
    std: str = "population",
    token_mean_over: str = "batch",
) -> StepSignal:
    """Group advantages of ``outcomes`` spread over their rows' generated tokens.

    Only ``ok`` rollouts train (and failed ones with rows when ``exclude_failed`` is
    False, at reward 0.0). With ``token_mean_over="batch"`` the ``ok`` rollouts of
    lone and constant groups are sent with advantage 0, so their tokens count in
    the token mean; with ``"trained"`` they are left out.
    """
    ok = [o.result.status is RolloutStatus.OK for o in outcomes]
    stats = compute_group_advantages(
        (
            RolloutScore(
                o.request.rollout_id,
                o.request.group_id,
                o.result.reward if is_ok else None,
                has_rows=bool(o.rows),
            )
            for o, is_ok in zip(outcomes, ok, strict=True)
        ),
        normalize_std=normalize_std,
        exclude_failed=exclude_failed,
        std=std,
    )
    signal = StepSignal()
    whole_batch = token_mean_over == "batch"
    for o, is_ok in zip(outcomes, ok, strict=True):
        adv = stats.advantages.get(o.request.rollout_id)
        if adv is None:
            if not (whole_batch and is_ok):
                continue
            adv = 0.0  # no signal, but its tokens count in the token mean
        signal.advantages[o.request.rollout_id] = adv
        for row in o.rows:
            datum = trace_to_datum(row, adv)
            if datum is not None:
                signal.datums.append(datum)
                signal.sources.append((o.request.rollout_id, row.row_index))
    signal.metrics = {
        "groups/total": float(stats.groups),
        "groups/skipped_constant": float(stats.skipped_constant),
        "groups/skipped_too_small": float(stats.skipped_too_small),
        "rollouts/excluded_failed": float(stats.excluded_failed),
        "rollouts/scored_failed": float(stats.scored_failed),
    }
    return signal

"""A step's finished rollouts turned into the datums ``forward_backward`` gets.

Factored out of the loop so the parity test (``core.testing.parity``) runs the
loop's own translation. Rollouts are anything with ``request`` (``rollout_id``,
``group_id``), ``result`` (``status``, ``reward``) and ``rows``, as
``RolloutOutcome`` has.

Credit (docs/multi_agent.md): every row trains with its rollout's group advantage,
except the rows of a policy for which the rollout returned a per-role reward
(``RolloutResult.role_rewards``): those get that reward's advantage within the
group's rollouts that returned one for the same policy (a per-role baseline).
``check_role_rewards`` fails, naming them, rollouts whose role names no policy of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.algo import RolloutScore, compute_group_advantages, trace_to_datum
from core.types import DEFAULT_POLICY, Datum, RolloutResult, RolloutStatus

TOKEN_MEAN_OVER = ("batch", "trained")
"""``algorithm.token_mean_over`` choices."""


@dataclass
class StepSignal:
    """What one step trains on."""

    datums: list[Datum] = field(default_factory=list)
    """In rollout order, then row order."""
    sources: list[tuple[str, int]] = field(default_factory=list)
    """``(rollout_id, row_index)`` of each datum."""
    policies: list[str] = field(default_factory=list)
    """The policy of each datum's row (the one that sampled it, and the one it trains)."""
    advantages: dict[str, float] = field(default_factory=dict)
    """Advantage of every rollout that trains (0.0 for lone and constant groups)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``groups/*`` and ``rollouts/excluded_failed``."""

    @property
    def has_signal(self) -> bool:
        """True when some trained token has a non-zero advantage; a step without one
        must not call ``optim_step`` (Adam's momentum would still move the weights)."""
        return any(a != 0.0 for d in self.datums for a in d.advantages)

    def by_policy(self) -> dict[str, list[Datum]]:
        """The datums grouped by the policy that trains them, in first-seen order."""
        return datums_by_policy(self.datums, self.policies)


def datums_by_policy(datums: Sequence[Datum], policies: Sequence[str]) -> dict[str, list[Datum]]:
    """``datums`` grouped by their policy (``policies[i]`` is datum ``i``'s): each policy
    trains only the rows it sampled."""
    out: dict[str, list[Datum]] = {}
    for datum, policy in zip(datums, policies, strict=True):
        out.setdefault(policy, []).append(datum)
    return out


def check_role_rewards(outcomes: Sequence[Any], policies: Sequence[str]) -> list[Any]:
    """``outcomes`` with each ``ok`` rollout whose ``role_rewards`` name a policy the run does
    not have turned ``invalid_reward``, its error naming the unknown and the known policies.

    With one policy every role shares it: role rewards have nothing to tell apart and are
    dropped (the rollout trains on its ``reward``), so a multi-role agent runs unchanged
    against one shared policy.
    """
    known = list(policies) or [DEFAULT_POLICY]
    out = []
    for o in outcomes:
        roles = o.result.role_rewards
        if o.result.status is not RolloutStatus.OK or not roles:
            out.append(o)
            continue
        if len(known) == 1:
            out.append(replace(o, result=replace(o.result, role_rewards={})))
            continue
        unknown = sorted(set(roles) - set(known))
        if not unknown:
            out.append(o)
            continue
        result = RolloutResult(
            o.result.rollout_id,
            RolloutStatus.INVALID_REWARD,
            metrics=o.result.metrics,
            error=(
                f"the agent's role_rewards name {unknown}, which are not policies of this run; its "
                f"policies are {known}. Return role rewards under those names, or configure the "
                "missing policies (+policies.<name>={}; docs/multi_agent.md)"
            ),
            elapsed_s=o.result.elapsed_s,
        )
        rows = [replace(r, reward=None, status=result.status) for r in o.rows]
        out.append(replace(o, result=result, rows=rows))
    return out


def _role_advantages(
    outcomes: Sequence[Any], ok: Sequence[bool], *, normalize_std: bool, exclude_failed: bool, std: str
) -> dict[tuple[str, str], float]:
    """``(rollout_id, policy) -> advantage`` of the per-role rewards: for each policy, its
    reward centred within the group's rollouts that returned one (failed ones as the rollout
    reward treats them)."""
    roles = sorted({p for o, is_ok in zip(outcomes, ok, strict=True) if is_ok for p in o.result.role_rewards})
    out: dict[tuple[str, str], float] = {}
    for policy in roles:
        scores = [
            RolloutScore(
                o.request.rollout_id,
                o.request.group_id,
                o.result.role_rewards[policy] if is_ok else None,
                has_rows=any(r.policy() == policy for r in o.rows),
            )
            for o, is_ok in zip(outcomes, ok, strict=True)
            if policy in o.result.role_rewards or not is_ok
        ]
        stats = compute_group_advantages(scores, normalize_std=normalize_std, exclude_failed=exclude_failed, std=std)
        out.update({(rollout_id, policy): adv for rollout_id, adv in stats.advantages.items()})
    return out


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
    by_role = _role_advantages(outcomes, ok, normalize_std=normalize_std, exclude_failed=exclude_failed, std=std)
    signal = StepSignal()
    whole_batch = token_mean_over == "batch"
    for o, is_ok in zip(outcomes, ok, strict=True):
        rollout_id = o.request.rollout_id
        adv = stats.advantages.get(rollout_id)
        if adv is None and whole_batch and is_ok:
            adv = 0.0  # no signal, but its tokens count in the token mean
        if adv is not None:
            signal.advantages[rollout_id] = adv
        roles = o.result.role_rewards if is_ok else {}
        for row in o.rows:
            policy = row.policy()
            row_adv = adv
            if policy in roles:
                row_adv = by_role.get((rollout_id, policy), 0.0 if whole_batch else None)
            if row_adv is None:
                continue
            datum = trace_to_datum(row, row_adv)
            if datum is not None:
                signal.datums.append(datum)
                signal.sources.append((rollout_id, row.row_index))
                signal.policies.append(policy)
                signal.advantages.setdefault(rollout_id, 0.0)
    signal.metrics = {
        "groups/total": float(stats.groups),
        "groups/skipped_constant": float(stats.skipped_constant),
        "groups/skipped_too_small": float(stats.skipped_too_small),
        "rollouts/excluded_failed": float(stats.excluded_failed),
        "rollouts/scored_failed": float(stats.scored_failed),
    }
    return signal

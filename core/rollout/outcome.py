"""A finished rollout and the status it trains under.

Defines ``RolloutOutcome`` (a rollout with the rows its gateway session recorded),
``classify`` (a rollout the runtime called ``ok`` checked against what the gateway
saw: a reward earned on a broken model call, one earned without any model call, or
an absurdly large one is not a clean sample, and every backend (core's loop, verl,
slime) must see the same status for it), ``check_exclude_on`` and the defaults of
the settings they read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from core.errors import ConfigError
from core.types import RolloutRequest, RolloutResult, RolloutStatus, TraceRecord

EXCLUDE_ON_CHOICES: dict[str, str] = {
    "sampler_error": "sampler_errors",
    "in_flight": "in_flight_at_finish",
    "aborted": "aborted_turns",
    "disconnected": "disconnected_turns",
}
"""``trainer.exclude_on`` names and the session fault counter each one reads."""

DEFAULT_EXCLUDE_ON: tuple[str, ...] = ("sampler_error", "in_flight", "aborted")
"""Faults that make an ``ok`` rollout ``sampler_error`` unless configured otherwise.
``disconnected`` is left out: the client chose to drop that call (its own timeout,
a cancelled speculative call), and the trace holds exactly what the agent received."""

DEFAULT_MAX_ABS_REWARD = 1e9
"""Largest ``|reward|`` accepted by default (``trainer.max_abs_reward``)."""

DEFAULT_REWARD_TIMEOUT_S = 60.0
"""How long a rollout that finished ``reward_pending`` waits for its reward (``reward.timeout_s``)."""

FAULT_KEYS: tuple[str, ...] = (
    "sampler_errors",
    "in_flight_at_finish",
    "aborted_turns",
    "disconnected_turns",
)
"""The gateway's per-session fault counters a ``RolloutOutcome`` carries."""


@dataclass
class RolloutOutcome:
    """A finished rollout with the rows the gateway recorded for it."""

    request: RolloutRequest
    """What was run."""
    result: RolloutResult
    """What the runtime reported."""
    rows: list[TraceRecord]
    """Trace rows of the rollout's session (possibly empty)."""
    faults: dict[str, int] = field(default_factory=dict)
    """The session's fault counters (``FAULT_KEYS``), ``model_turns`` (turns recorded)
    and ``finished_early``/``session_lost`` when the runner found the session
    already finished or dropped. Read from the session itself, so a rollout whose
    only model call failed (no rows) still shows it."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The session's message tree as the gateway recorded it (``core.rundir.traces.
    conversation_tree``): what the agent sent and what the model replied, forks included."""

    @property
    def ok(self) -> bool:
        return self.result.status is RolloutStatus.OK


def check_exclude_on(names: Iterable[str]) -> frozenset[str]:
    """Validate ``trainer.exclude_on``; returns the names as a set."""
    chosen = frozenset(str(n) for n in names)
    unknown = sorted(chosen - set(EXCLUDE_ON_CHOICES))
    if unknown:
        raise ConfigError(
            f"trainer.exclude_on has {unknown!r}; choose from {sorted(EXCLUDE_ON_CHOICES)} "
            f"(default {list(DEFAULT_EXCLUDE_ON)}, [] trains every rollout the agent called ok)"
        )
    return chosen


def classify(
    result: RolloutResult,
    faults: Mapping[str, int] | None,
    *,
    exclude_on: frozenset[str] = frozenset(DEFAULT_EXCLUDE_ON),
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
) -> RolloutResult:
    """The status a rollout trains under, given what the gateway saw of it.

    Only an ``ok`` result can change (a failed one keeps its status):

    - ``invalid_reward`` when ``|reward| > max_abs_reward`` (a sentinel or a bug; it
      would also swamp its group's statistics);
    - ``sampler_error`` when a fault named in ``exclude_on`` happened (a model call
      failed or was aborted in the gateway, or was still in flight when the agent
      returned): the reward was earned on a broken turn;
    - ``no_model_calls`` when the session recorded no turn: nothing to train, and
      the reward says nothing about the policy.

    ``faults`` None: no gateway saw the rollout (an evaluation against
    ``eval.endpoint``), so only the reward bound can be checked.
    """
    if result.status is not RolloutStatus.OK:
        return result
    reward = float(result.reward)  # type: ignore[arg-type]  # OK results carry a finite reward
    if abs(reward) > max_abs_reward:
        return _failed(
            result,
            RolloutStatus.INVALID_REWARD,
            f"the agent's reward {reward!r} is larger in magnitude than trainer.max_abs_reward="
            f"{max_abs_reward!r}; rescale the reward or raise the bound",
        )
    if faults is None:
        return result
    hits = {
        name: int(faults.get(counter, 0))
        for name, counter in EXCLUDE_ON_CHOICES.items()
        if name in exclude_on and int(faults.get(counter, 0)) > 0
    }
    if hits:
        seen = ", ".join(f"{EXCLUDE_ON_CHOICES[n]}={k}" for n, k in hits.items())
        return _failed(
            result,
            RolloutStatus.SAMPLER_ERROR,
            f"the agent returned reward {reward!r}, but its session had {seen}: the reward was "
            "earned on a broken model call, so the rollout is excluded (trainer.exclude_on="
            f"{sorted(exclude_on)} decides which faults exclude)",
        )
    if int(faults.get("model_turns", 0)) == 0:
        return _failed(
            result,
            RolloutStatus.NO_MODEL_CALLS,
            f"the agent returned reward {reward!r} without a model call through the gateway: "
            "nothing to train, and the reward says nothing about the policy",
        )
    return result


def _failed(result: RolloutResult, status: RolloutStatus, error: str) -> RolloutResult:
    return RolloutResult(
        rollout_id=result.rollout_id,
        status=status,
        reward=None,
        metrics=result.metrics,
        error=error,
        elapsed_s=result.elapsed_s,
    )


def lost(result: RolloutResult) -> RolloutResult:
    """``result`` of a rollout whose gateway session was dropped before it finished."""
    note = (
        "the rollout's gateway session was dropped before it finished (DELETE "
        "/admin/sessions/<id>?), so its trace is lost and nothing of it can be trained"
    )
    if result.status is not RolloutStatus.OK:
        return replace(result, error=f"{result.error or result.status.value}; {note}")
    return _failed(result, RolloutStatus.CRASHED, note)


def shard_lost(result: RolloutResult, why: str) -> RolloutResult:
    """``result`` of a rollout whose gateway shard died (``why`` names it): the trace is
    lost, so even an ``ok`` rollout becomes ``crashed``; a failed one keeps its status."""
    note = f"its gateway shard is gone ({why}), so its trace is lost and nothing of it can be trained"
    if result.status is not RolloutStatus.OK:
        return replace(result, error=f"{result.error or result.status.value}; {note}")
    return _failed(result, RolloutStatus.CRASHED, note)

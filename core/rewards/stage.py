"""Applying the configured reward (``reward=<name>``) to finished rollouts.

``RewardStage.score`` takes a step's (or an evaluation's) outcomes, hands each
group's scorable rollouts to the reward function, and returns the outcomes with
their results and trace rows restamped: the new reward (per ``reward.mode``),
``reward/<component>`` metrics, or ``judge_error`` when the function could not
score one. ``reward=agent`` (the default) leaves every outcome as it is.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from core.errors import ConfigError
from core.rewards.base import MODES, RewardFunction, RewardInput, RewardOutput
from core.rollout import DEFAULT_MAX_ABS_REWARD, RolloutOutcome, classify
from core.types import RolloutResult, RolloutStatus

__all__ = ["RESERVED_COMPONENTS", "RewardStage", "build_reward_stage", "component_metrics"]

RESERVED_COMPONENTS = ("mean", "std")
"""Component names taken by the loop's own ``reward/mean`` and ``reward/std``."""


class RewardStage:
    """Scores outcomes with ``function`` (None: the agent's reward stands)."""

    def __init__(
        self,
        function: RewardFunction | None,
        *,
        name: str = "agent",
        mode: str = "replace",
        component: str = "",
        runner: Any = None,
        max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"reward.mode={mode!r}; use one of {', '.join(MODES)}")
        self.function = function
        self.name = name
        self.mode = mode
        self.component = component or name
        if self.component in RESERVED_COMPONENTS:
            raise ConfigError(
                f"reward.component={self.component!r} would overwrite the loop's reward/{self.component}; "
                "choose another name"
            )
        self._runner = runner
        self.max_abs_reward = max_abs_reward

    async def aclose(self) -> None:
        close = getattr(self.function, "aclose", None)
        if close is not None:
            await close()

    async def score(self, outcomes: Sequence[RolloutOutcome]) -> list[RolloutOutcome]:
        """The outcomes, in order, scored by the function (unchanged for ``reward=agent``)."""
        out = list(outcomes)
        if self.function is None:
            return out
        groups: dict[str, list[int]] = {}
        for i, o in enumerate(out):
            if self._scorable(o):
                groups.setdefault(o.request.group_id, []).append(i)
        results = await asyncio.gather(*(self._score_group([out[i] for i in idx]) for idx in groups.values()))
        for idx, scored in zip(groups.values(), results, strict=True):
            for i, o in zip(idx, scored, strict=True):
                out[i] = o
        return out

    def _scorable(self, o: RolloutOutcome) -> bool:
        if o.result.status is RolloutStatus.OK:
            return True
        # With mode=replace the agent need not compute a reward at all: a rollout that
        # finished without one is scored, after the same checks an ok one passed.
        return self.mode == "replace" and o.result.status is RolloutStatus.NO_REWARD and bool(o.rows)

    def _as_ok(self, o: RolloutOutcome) -> RolloutResult | None:
        """An ok result for a ``no_reward`` rollout that passes ``classify``, else None."""
        if o.result.status is RolloutStatus.OK:
            return o.result
        stand_in = replace(o.result, status=RolloutStatus.OK, reward=0.0, error=None)
        kwargs: dict[str, Any] = {}
        if self._runner is not None and hasattr(self._runner, "exclude_on"):
            kwargs = {"exclude_on": self._runner.exclude_on, "max_abs_reward": self._runner.max_abs_reward}
        checked = classify(stand_in, o.faults, **kwargs)
        return checked if checked.status is RolloutStatus.OK else None

    async def _score_group(self, group: list[RolloutOutcome]) -> list[RolloutOutcome]:
        assert self.function is not None
        ready = [(o, self._as_ok(o)) for o in group]
        scorable = [(o, r) for o, r in ready if r is not None]
        inputs = [
            RewardInput(
                rollout_id=o.request.rollout_id,
                group_id=o.request.group_id,
                payload=o.request.payload,
                result=r,
                rows=o.rows,
                conversation=o.conversation,
            )
            for o, r in scorable
        ]
        try:
            outputs = list(await self.function.score(inputs)) if inputs else []
            if len(outputs) != len(inputs):
                raise ValueError(f"returned {len(outputs)} outputs for {len(inputs)} rollouts")
        except Exception as exc:  # a broken judge or verifier: its own status, never a silent 0
            outputs = [RewardOutput(error=f"{type(exc).__name__}: {exc}")] * len(inputs)
        by_id = {o.request.rollout_id: (r, out) for (o, r), out in zip(scorable, outputs, strict=True)}
        return [self._apply(o, *by_id[o.request.rollout_id]) if o.request.rollout_id in by_id else o for o in group]

    def _apply(self, o: RolloutOutcome, base: RolloutResult, out: RewardOutput) -> RolloutOutcome:
        score = _finite(out.reward)
        error = out.error
        if error is None and score is None:
            error = f"returned reward {out.reward!r}, not a finite number"
        components: dict[str, float] = {}
        for key, value in (out.components or {}).items() if error is None else ():
            number = _finite(value)
            if number is None:
                error = f"returned component {key!r}={value!r}, not a finite number"
                break
            components[str(key)] = number
        failed_key = f"reward/{self.component}_failed"
        if error is not None and self.mode == "log":
            # The agent's reward trains in log mode: a judge that cannot score only
            # loses the logged score (reward/<component>_failed is the failure rate).
            return _restamp(o, replace(base, metrics={**base.metrics, failed_key: 1.0}))
        if error is not None:
            result = RolloutResult(
                base.rollout_id,
                RolloutStatus.JUDGE_ERROR,
                metrics=base.metrics,
                error=f"reward {self.name!r} could not score the rollout: {error}",
                elapsed_s=base.elapsed_s,
            )
            return _restamp(o, result)
        assert score is not None
        agent = float(base.reward or 0.0)
        reward = {"replace": score, "add": agent + score, "log": agent}[self.mode]
        if abs(reward) > self.max_abs_reward:
            # The bound the agent's own reward meets (RolloutRunner.classify): a plugin's
            # 1e12 is a bug or a sentinel, and would swamp every advantage of its group.
            result = RolloutResult(
                base.rollout_id,
                RolloutStatus.INVALID_REWARD,
                metrics=base.metrics,
                error=(f"reward {self.name!r} gave {reward!r}, larger in magnitude than "
                       f"trainer.max_abs_reward={self.max_abs_reward:g}"),
                elapsed_s=base.elapsed_s,
            )
            return _restamp(o, result)
        metrics = dict(base.metrics)
        metrics[f"reward/{self.component}"] = score
        if self.mode == "log":
            metrics[failed_key] = 0.0
        for key, value in components.items():
            if key not in RESERVED_COMPONENTS:
                metrics[f"reward/{key}"] = value
        return _restamp(o, replace(base, reward=reward, metrics=metrics))


def _finite(value: Any) -> float | None:
    """``value`` as a finite float; None for bools, non-numbers, NaN and infinities
    (a plugin's ``"0.7"`` or ``nan`` must become ``judge_error``, not crash the step)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _restamp(o: RolloutOutcome, result: RolloutResult) -> RolloutOutcome:
    reward = result.reward if result.status is RolloutStatus.OK else None
    rows = [replace(r, reward=reward, status=result.status) for r in o.rows]
    return replace(o, result=result, rows=rows)


def build_reward_stage(cfg: Any, plugins: Any, runner: Any = None) -> RewardStage:
    """The stage for ``cfg.reward`` (``reward=agent`` when the config has none)."""
    node = cfg.get("reward") if hasattr(cfg, "get") else None
    name = str(node.get("name", "agent")) if node is not None else "agent"
    if node is None or name == "agent":
        return RewardStage(None, runner=runner)
    spec = plugins.reward(name)
    return RewardStage(
        spec.factory(cfg),
        name=name,
        mode=str(node.get("mode", "replace")),
        component=str(node.get("component", "") or ""),
        runner=runner,
        max_abs_reward=float((cfg.get("trainer") or {}).get("max_abs_reward", DEFAULT_MAX_ABS_REWARD)),
    )


def component_metrics(outcomes: Sequence[RolloutOutcome]) -> dict[str, float]:
    """Mean of each ``reward/<component>`` over the ``ok`` outcomes that carry it.

    An outcome's metrics are partly the agent's own, so the names the run logs itself
    (``reward/mean``, ``reward/std``: ``RESERVED_COMPONENTS``) and values that are not
    finite numbers are left out: an agent reporting ``reward/mean`` overwrote the run's
    logged reward (an untrained policy showed 0.990)."""
    reserved = {f"reward/{name}" for name in RESERVED_COMPONENTS}
    values: dict[str, list[float]] = {}
    for o in outcomes:
        if o.result.status is RolloutStatus.OK:
            for key, value in o.result.metrics.items():
                number = _finite(value)
                if key.startswith("reward/") and key not in reserved and number is not None:
                    values.setdefault(key, []).append(number)
    return {key: sum(v) / len(v) for key, v in sorted(values.items())}

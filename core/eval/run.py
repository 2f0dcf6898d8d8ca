"""Running an eval set: the same runner the training loop uses, or an endpoint directly.

``run_eval`` is what both ``python -m core.eval`` and the loop's periodic
evaluation call: ``samples_per_prompt`` rollouts of each eval row through a
runner (``RolloutRunner`` over the gateway, or ``EndpointRunner``), scored by
the configured reward stage, turned into ``EvalRow`` records.

``EndpointRunner`` points the agent at any OpenAI-compatible endpoint (a
hosted model as a baseline): no gateway, so no trace capture and no token
counts; the sampling settings travel to the agent as ``_config.sampling_params``.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.eval.results import EvalRow, k_values, payload_key, summarize
from core.rollout import DEFAULT_MAX_ABS_REWARD, RolloutOutcome, classify, run_groups
from core.types import RolloutRequest, RolloutStatus, SamplingParams

__all__ = ["EndpointRunner", "eval_metrics", "outcome_row", "run_eval"]


@dataclass
class EndpointRunner:
    """Runs rollouts with the agent calling ``base_url`` itself (no gateway, no trace)."""

    runtime: Any
    """A started ``RolloutRuntime``."""
    base_url: str
    """The endpoint's OpenAI-style base URL (ending in ``/v1``)."""
    model_id: str
    """Model name the agent sends."""
    api_key: str
    """API key the agent sends (its ``_config.api_key``)."""
    max_concurrency: int
    """Most rollouts at once."""
    timeout_s: float
    """Deadline of one rollout."""
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
    """Rewards larger in magnitude are ``invalid_reward`` (``classify``)."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"eval.endpoint={self.base_url!r} must be an http(s) URL of an OpenAI-compatible "
                "API, e.g. https://api.openai.com/v1"
            )
        self._sem = asyncio.Semaphore(self.max_concurrency)

    async def run_one(
        self, payload: dict[str, Any], *, group_id: str, sampling: SamplingParams
    ) -> RolloutOutcome:
        """One rollout against the endpoint; failures come back as the outcome's status."""
        rollout_id = uuid.uuid4().hex
        params: dict[str, Any] = {"temperature": sampling.temperature, "max_tokens": sampling.max_tokens}
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        request = RolloutRequest(
            rollout_id=rollout_id,
            group_id=group_id,
            payload=payload,
            base_url=self.base_url.rstrip("/"),
            session_id=self.api_key,
            model_id=self.model_id,
            sampling_params=params,
            timeout_s=self.timeout_s,
        )
        async with self._sem:
            result = await self.runtime.run_rollout(request)
        # The checks an in-process evaluation's rollout meets, but those that need the
        # gateway's view of the session (its faults, whether the model was called).
        result = classify(result, None, max_abs_reward=self.max_abs_reward)
        return RolloutOutcome(request=request, result=result, rows=[])

    async def run_groups(
        self,
        payloads: Sequence[tuple[str, dict[str, Any]]],
        *,
        group_size: int,
        sampling: SamplingParams,
        on_done: Callable[[RolloutOutcome], None] | None = None,
    ) -> list[RolloutOutcome]:
        """``group_size`` rollouts of each ``(group_id, payload)``, in order (as ``RolloutRunner``)."""
        return await run_groups(self.run_one, payloads, group_size=group_size, sampling=sampling, on_done=on_done)


def outcome_row(prompt: int, sample: int, payload: dict[str, Any], outcome: RolloutOutcome) -> EvalRow:
    """The ``EvalRow`` of one finished rollout."""
    result = outcome.result
    versions = [t.weight_version for r in outcome.rows for t in r.turns]
    policies: dict[str, int] = {}
    for row in outcome.rows:
        policies[row.policy()] = policies.get(row.policy(), 0) + len(row.turns)
    return EvalRow(
        prompt=prompt,
        sample=sample,
        payload_key=payload_key(payload),
        status=result.status.value,
        reward=result.reward if result.status is RolloutStatus.OK else None,
        rollout_id=outcome.request.rollout_id,
        error=result.error,
        prompt_tokens=sum(r.prompt_length for r in outcome.rows),
        generated_tokens=sum(r.num_generated for r in outcome.rows),
        weight_version=max(versions) if versions else None,
        components={
            k[len("reward/"):]: v for k, v in result.metrics.items() if k.startswith("reward/")
        },
        elapsed_s=result.elapsed_s,
        policies=policies,
        role_rewards=dict(result.role_rewards),
    )


async def run_eval(
    runner: Any,
    payloads: Sequence[dict[str, Any]],
    *,
    samples_per_prompt: int,
    sampling: SamplingParams,
    rewards: Any = None,
    progress: bool = False,
) -> tuple[list[RolloutOutcome], list[EvalRow]]:
    """Run ``samples_per_prompt`` rollouts of every payload; the outcomes and their rows.

    Args:
        runner: ``RolloutRunner`` (gateway, trace capture) or ``EndpointRunner``.
        rewards: A ``core.rewards.RewardStage`` scoring each prompt's group, or None
            (the agent's own reward).
        progress: Show a progress bar on stderr.
    """
    if samples_per_prompt < 1:
        raise ConfigError(f"eval.samples_per_prompt must be >= 1, got {samples_per_prompt}")
    bar: Any = None
    if progress:
        import sys

        from tqdm import tqdm

        bar = tqdm(total=len(payloads) * samples_per_prompt, desc="eval", unit="rollout", file=sys.stderr)
    try:
        outcomes = await runner.run_groups(
            [(f"eval{i}", p) for i, p in enumerate(payloads)],
            group_size=samples_per_prompt,
            sampling=sampling,
            on_done=(lambda _o: bar.update(1)) if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    if rewards is not None:
        outcomes = await rewards.score(outcomes)
    rows = [
        outcome_row(i // samples_per_prompt, i % samples_per_prompt, payloads[i // samples_per_prompt], o)
        for i, o in enumerate(outcomes)
    ]
    return outcomes, rows


def eval_metrics(rows: Sequence[EvalRow], *, pass_threshold: float = 1.0) -> dict[str, float]:
    """The loop's ``eval/*`` metrics of one evaluation (names kept from before ``core.eval``)."""
    summary = summarize(rows, pass_threshold=pass_threshold)
    out = {
        "eval/reward_mean": float(summary["reward_mean"]),
        "eval/failed": float(summary["failed"]),
    }
    n = int(summary["samples_per_prompt"])
    for k in k_values(n) if n else []:
        out[f"eval/pass@{k}"] = float(summary[f"pass@{k}"])
    for key, value in summary.items():
        per = key.startswith(("reward/", "policy/", "role/"))
        if per and isinstance(value, float) and math.isfinite(value):
            out[f"eval/{key}"] = value
    return out

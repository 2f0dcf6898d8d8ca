"""slime's ``--custom-generate-function-path`` target: one slime sample = one tracerl rollout.

Defines ``generate`` (the hook), ``payload_of`` and ``sampling_of``.

Per call (slime runs many concurrently on its rollout process's loop):

1. the process's ``WorkerHost`` (gateway sampling through slime's SGLang
   router, HTTP server, runtime) is started on first use;
2. one gateway session is opened with sampling from slime's
   ``sampling_params`` (temperature, top_p, top_k, stop strings and ids; each
   turn capped by ``algorithm.max_tokens`` and slime's ``max_new_tokens``);
3. the agent runs on the sample's payload through the runtime, calling the
   gateway with the session id as its API key;
4. the session's trace rows become ``list[Sample]`` sharing one
   ``rollout_id``, each with ``reward`` set (``tracerl_slime.rows``).

Every status but ``ok`` is a failure (timeout, crash, no or bad reward,
``sampler_error``: a model call broke in the gateway, ``no_model_calls``: a
reward without any model call), and so is an ``ok`` rollout with no
trainable row (recorded as ``no_model_calls``). A failure becomes one
ABORTED sample with ``remove_sample=True``: slime trains none of its tokens
and ``tracerl_slime.rewards`` keeps it out of the group baseline. With
``algorithm.exclude_failed=false`` a failed rollout that has rows is
returned scored 0.0 instead (as core's loop does; one without rows stays out).
"""

from __future__ import annotations

import logging
from typing import Any

from core.types import RolloutStatus, SamplingParams
from tracerl_slime.host import WorkerHost
from tracerl_slime.rows import failed_sample, rows_to_samples

logger = logging.getLogger("tracerl_slime.generate")

PAYLOAD_KEY = "tracerl_payload"
"""``Sample.metadata`` key holding the agent payload (written by the launcher's data step)."""


def payload_of(sample: Any) -> dict[str, Any]:
    """The agent payload of a slime sample.

    ``metadata["tracerl_payload"]`` when present (data written by ``python -m
    core.train backend=slime``); otherwise a slime-native row becomes
    ``{"prompt": sample.prompt, "label": sample.label, **metadata}``.
    """
    meta = dict(sample.metadata or {})
    payload = meta.get(PAYLOAD_KEY)
    if payload is None:
        return {"prompt": sample.prompt, "label": sample.label, **meta}
    if not isinstance(payload, dict):
        raise TypeError(
            f"Sample.metadata[{PAYLOAD_KEY!r}] must be a mapping, got {type(payload).__name__}; "
            "write slime data with tracerl_slime.data.write_slime_dataset"
        )
    return dict(payload)


def sampling_of(cfg: Any, sampling_params: dict[str, Any]) -> SamplingParams:
    """Per-turn sampling for the gateway session from slime's ``sampling_params``."""
    max_tokens = int(cfg.algorithm.max_tokens)
    budget = sampling_params.get("max_new_tokens")
    if budget:
        max_tokens = max(1, min(max_tokens, int(budget)))
    top_k = sampling_params.get("top_k")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(sampling_params.get("temperature", cfg.algorithm.temperature)),
        top_p=float(sampling_params.get("top_p") or 1.0),
        top_k=int(top_k) if top_k not in (None, 0) else -1,
        stop=tuple(sampling_params.get("stop") or ()),
        stop_token_ids=tuple(int(t) for t in sampling_params.get("stop_token_ids") or ()),
    )


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return 0


async def generate(
    args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Any]:
    """Run one agent rollout for ``sample``; return its trace rows as slime samples.

    Args:
        args: slime's parsed arguments (router address, ``hf_checkpoint``, and the
            tracerl config under ``args.tracerl``).
        sample: The input sample (``group_index``, ``index``, ``metadata`` payload).
        sampling_params: slime's per-sample sampling dict (``GenerateState.sampling_params``).
        evaluation: True during slime's eval rollouts (informational: slime already
            passes the eval sampling settings).

    Returns:
        One ``Sample`` per trace row, all sharing ``rollout_id``; or one ABORTED
        ``remove_sample`` sample when the rollout failed.

    Raises:
        ConfigError: tracerl's config is missing from ``args`` or the router is unknown.
        TrainingError: too many recent rollouts failed (``trainer.max_failure_rate``).
    """
    host = await WorkerHost.get(args)
    cfg = host.cfg
    sampling = sampling_of(cfg, sampling_params)
    group = f"slime-{sample.group_index}" if sample.group_index is not None else "slime"
    outcome = await host.runner.run_one(payload_of(sample), group_id=group, sampling=sampling)
    result = outcome.result
    ok = result.status is RolloutStatus.OK
    info = {
        "status": result.status.value,
        "tracerl_rollout_id": outcome.request.rollout_id,
        "elapsed_s": round(result.elapsed_s, 3),
        "evaluation": bool(evaluation),
    }
    reward = float(result.reward) if ok and result.reward is not None else 0.0
    samples = rows_to_samples(
        sample, outcome.rows, reward=reward, tokenizer=host.tokenizer, info=info
    )
    failed = not ok or not samples
    if ok and not samples:  # the runner's own check may predate no_model_calls
        info["status"] = RolloutStatus.NO_MODEL_CALLS.value
    if failed:
        why = (
            f"rollout {outcome.request.rollout_id} ended with status {result.status.value!r}: "
            f"{(result.error or '').strip()[-1000:]}"
            if not ok
            else f"rollout {outcome.request.rollout_id} made no trainable model call through the gateway"
        )
        exclude = bool(cfg.algorithm.get("exclude_failed", True))
        if exclude or not samples:
            logger.warning("%s; excluded from training", why)
            samples = [
                failed_sample(
                    sample,
                    pad_token_id=_pad_id(host.tokenizer),
                    reason=why,
                    status=str(info["status"]),
                    info=info,
                )
            ]
        else:
            logger.warning("%s; scored 0.0 (algorithm.exclude_failed=false)", why)
    host.stats["samples"] += len(samples)
    if not evaluation:
        host.record(failed)
    return samples

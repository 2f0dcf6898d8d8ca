"""The sampler over a SageMaker training session's ``SamplingClient``.

SageMaker specifics handled here (each differs from Tinker):

- ``max_tokens`` must be at least 512. A smaller request is sent as
  ``min_sample_max_tokens`` and the reply is cut to the requested length here;
  the tokens kept are exactly the ones sampled, so the trace stays exact.
- ``stop`` takes strings only (token ids raise ``ValueError`` in the SDK): stop
  token ids are sent as their decoded text, and the reply is also cut after the
  first stop id on this side, since text matching may not line up with tokens.
- ``SampledSequence`` has no ``sequence_id``; its ``stop_reason`` is a str enum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.errors import SamplerError
from core.remote_sdk import SamplerSlot, await_result, finish_reason
from core.types import FinishReason, SampleResult, SamplingParams


def sagemaker_sampling_params(
    params: SamplingParams, tokenizer: Any | None, *, min_max_tokens: int
) -> Any:
    """The SDK's ``SamplingParams`` for ``params`` (see the module docstring)."""
    from sagemaker.train.training_session import SamplingParams as SMSamplingParams

    stop = list(params.stop)
    for token_id in params.stop_token_ids:
        if tokenizer is None:
            raise SamplerError(
                "SageMaker takes stop strings only and no tokenizer is available to turn "
                f"stop token id {token_id} into text"
            )
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if text and text not in stop:
            stop.append(text)
    return SMSamplingParams(
        max_tokens=max(params.max_tokens, min_max_tokens),
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=None if params.top_k == -1 else params.top_k,
        seed=params.seed,
        stop=stop or None,
    )


def cut(
    tokens: list[int],
    logprobs: list[float],
    reason: FinishReason,
    params: SamplingParams,
) -> tuple[list[int], list[float], FinishReason]:
    """Apply the caller's stop ids and ``max_tokens`` to a reply sampled with a larger budget."""
    stops = set(params.stop_token_ids)
    for i, token in enumerate(tokens[: params.max_tokens]):
        if token in stops:
            return tokens[: i + 1], logprobs[: i + 1], FinishReason.STOP
    if len(tokens) > params.max_tokens:
        return tokens[: params.max_tokens], logprobs[: params.max_tokens], FinishReason.LENGTH
    return tokens, logprobs, reason


class SageMakerSampler:
    """``core.interfaces.Sampler`` over whichever ``SamplingClient`` is current.

    Each request takes the client (bound to one model package) and its weight
    version together, so a request in flight during ``sync_sampler`` finishes
    on the checkpoint it started on and reports that version.
    """

    def __init__(
        self,
        slot: SamplerSlot[Any],
        *,
        tokenizer: Any | None,
        timeout_s: float,
        min_max_tokens: int,
    ) -> None:
        self._slot = slot
        self._tokenizer = tokenizer
        self._timeout_s = timeout_s
        self._min_max_tokens = min_max_tokens

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str,
    ) -> SampleResult:
        """Continue ``prompt_token_ids`` with the current weights (see ``Sampler``)."""
        client, version = self._slot.current()
        try:
            sdk_params = sagemaker_sampling_params(
                params, self._tokenizer, min_max_tokens=self._min_max_tokens
            )
            future = client.sample([int(t) for t in prompt_token_ids], 1, sdk_params)
        except SamplerError:
            raise
        except Exception as exc:
            raise SamplerError(f"sagemaker sample failed to submit: {type(exc).__name__}: {exc}") from exc
        response = await await_result(
            future, what="sagemaker sample", timeout=self._timeout_s, error_cls=SamplerError
        )
        if not response.sequences:
            raise SamplerError(f"sagemaker returned no sequence for session {session_id!r}")
        seq = response.sequences[0]
        if seq.logprobs is None:
            raise SamplerError(
                "sagemaker returned tokens without logprobs; tracerl needs the sampler's "
                "logprobs to train"
            )
        tokens, logprobs, reason = cut(
            [int(t) for t in seq.tokens],
            [float(x) for x in seq.logprobs],
            finish_reason(seq.stop_reason),
            params,
        )
        return SampleResult(
            token_ids=tokens, logprobs=logprobs, finish_reason=reason, weight_version=version
        )

"""The sampler over Tinker's ``SamplingClient.sample`` (token ids in; tokens, logprobs out).

Tinker specifics handled here:

- ``stop`` takes strings *or* token ids, never both in one list, and a list
  replaces the model's end-of-sequence stop (``[]`` disables it). So ids are
  sent together with the EOS id; when stop strings are asked for as well,
  everything is sent as text (ids decoded with the tokenizer).
- ``SampledSequence.logprobs`` may be ``None`` if the service did not return
  them; tracerl cannot train without them, so that is a ``SamplerError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.errors import SamplerError
from core.remote_sdk import SamplerSlot, await_result, finish_reason
from core.types import SampleResult, SamplingParams


def tinker_stop(params: SamplingParams, tokenizer: Any | None) -> list[str] | list[int] | None:
    """The ``stop`` value Tinker should get for ``params`` (see module docstring)."""
    if not params.stop and not params.stop_token_ids:
        return None  # keep Tinker's implicit EOS stop
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    ids = list(params.stop_token_ids)
    if eos is not None and eos not in ids:
        ids.append(int(eos))
    if not params.stop:
        return ids
    if tokenizer is None:
        raise SamplerError(
            "Tinker cannot mix stop strings and stop token ids in one request, and no "
            "tokenizer is available to turn the ids into text; pass only one kind"
        )
    texts = list(params.stop)
    for token_id in ids:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if text and text not in texts:
            texts.append(text)
    return texts


class TinkerSampler:
    """``core.interfaces.Sampler`` over whichever Tinker ``SamplingClient`` is current.

    Each request takes the client and weight version together from the slot,
    so a request in flight while ``sync_sampler`` swaps clients finishes on
    the old client and reports the old version.
    """

    def __init__(
        self, slot: SamplerSlot[Any], *, tokenizer: Any | None, timeout_s: float
    ) -> None:
        self._slot = slot
        self._tokenizer = tokenizer
        self._timeout_s = timeout_s

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str,
    ) -> SampleResult:
        """Continue ``prompt_token_ids`` with the current weights (see ``Sampler``)."""
        from tinker import types

        client, version = self._slot.current()
        sdk_params = types.SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            stop=tinker_stop(params, self._tokenizer),
        )
        prompt = types.ModelInput.from_ints([int(t) for t in prompt_token_ids])
        try:
            future = client.sample(prompt, 1, sdk_params)
        except Exception as exc:
            raise SamplerError(f"tinker sample failed to submit: {type(exc).__name__}: {exc}") from exc
        response = await await_result(
            future, what="tinker sample", timeout=self._timeout_s, error_cls=SamplerError
        )
        if not response.sequences:
            raise SamplerError(f"tinker returned no sequence for session {session_id!r}")
        seq = response.sequences[0]
        tokens = [int(t) for t in seq.tokens]
        logprobs = seq.logprobs
        if logprobs is None:
            raise SamplerError(
                "tinker returned tokens without logprobs; tracerl needs the sampler's "
                "logprobs to train (check the SDK version)"
            )
        if len(tokens) > params.max_tokens:  # never trust a server with the budget
            tokens, logprobs = tokens[: params.max_tokens], list(logprobs)[: params.max_tokens]
        return SampleResult(
            token_ids=tokens,
            logprobs=[float(x) for x in logprobs],
            finish_reason=finish_reason(seq.stop_reason),
            weight_version=version,
        )

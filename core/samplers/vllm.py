"""Sampling from vLLM servers with token ids in and token ids plus logprobs out.

Defines ``VLLMSampler``. Two endpoints, chosen by ``HttpSamplerConfig.vllm_endpoint``:

- ``generate``: ``POST /inference/v1/generate`` with ``{"request_id", "token_ids",
  "sampling_params": {..., "logprobs": 1}}``; the answer's
  ``choices[0].token_ids``, ``choices[0].logprobs.content[i].logprob``,
  ``finish_reason`` and, on MoE servers started for it, ``routed_experts``.
- ``completions``: ``POST /v1/completions`` with a token-id ``prompt``,
  ``logprobs: 1`` and ``return_token_ids: true``; the answer's
  ``choices[0].token_ids`` and ``choices[0].logprobs.token_logprobs``.

Session affinity: ``x-session-id`` (vllm-router's sticky header). Cancel:
vLLM aborts a request whose client disconnects, which is what happens when
the awaiting task is cancelled (httpx closes the connection).

Prefix cache: every request carries ``cache_salt="tracerl-v<weight_version>"``
(vLLM hashes it into the first KV block), so a turn labelled with a weight
version never reuses KV blocks that requests of an older version computed,
even where a cache reset after the push was refused or silently did nothing.

Logprobs: vLLM reports raw-model logprobs unless started with
``--logprobs-mode processed_logprobs``; at temperature 1 without top-k/top-p
the two agree (docs/samplers.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from core.samplers.http_pool import ServerState
from core.samplers.http_sampler import HttpSampler, finish_reason_of
from core.types import SampleResult, SamplingParams

__all__ = ["VLLMSampler", "cache_salt"]

GENERATE_PATH = "/inference/v1/generate"
COMPLETIONS_PATH = "/v1/completions"


def cache_salt(version: int) -> str:
    """The prefix-cache salt of requests sampled at weight ``version``."""
    return f"tracerl-v{version}"


def _sampling(params: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "logprobs": 1,
        "skip_special_tokens": False,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["seed"] = params.seed
    return out


class VLLMSampler(HttpSampler):
    """``core.interfaces.Sampler`` over one or more vLLM servers (or a vllm-router)."""

    protocol: ClassVar[str] = "vLLM"
    affinity_header_name: ClassVar[str] = "x-session-id"

    def _request(
        self, prompt: Sequence[int], params: SamplingParams, rid: str
    ) -> tuple[str, dict[str, Any]]:
        sampling = _sampling(params)
        sampling.update(self.config.extra_sampling_params)
        salt = cache_salt(self.weight_version)
        if self.config.vllm_endpoint == "completions":
            body: dict[str, Any] = {
                "prompt": list(prompt),
                "return_token_ids": True,
                "request_id": rid,
                "cache_salt": salt,
                **sampling,
            }
            path = COMPLETIONS_PATH
        else:
            body = {
                "request_id": rid,
                "token_ids": list(prompt),
                "sampling_params": sampling,
                "cache_salt": salt,
            }
            path = GENERATE_PATH
        if self.config.model:
            body["model"] = self.config.model
        return path, body

    def _not_found_fix(self) -> str:
        if self.config.vllm_endpoint == "generate":
            return (
                "this vLLM does not serve /inference/v1/generate (a build without the tokens-in/tokens-out "
                "API); upgrade vLLM or set HttpSamplerConfig.vllm_endpoint=completions"
            )
        return "check that HttpSamplerConfig.urls points at the vLLM root URL (no /v1 suffix) and HttpSamplerConfig.model names a served model"

    def _parse(self, server: ServerState, data: Any, params: SamplingParams, version: int) -> SampleResult:
        path = COMPLETIONS_PATH if self.config.vllm_endpoint == "completions" else GENERATE_PATH
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self.fail(
                server,
                f"the answer to POST {path} has no choices: {str(data)[:200]!r}",
                "check that HttpSamplerConfig.urls points at a vLLM server",
            )
        choice = choices[0]
        ids = choice.get("token_ids")
        if not isinstance(ids, list) or not all(type(t) is int for t in ids):
            raise self.fail(
                server,
                f"the answer to POST {path} has no token ids (choices[0].token_ids={str(ids)[:80]})",
                "use a vLLM that returns token ids (>= 0.10.2 for return_token_ids), or "
                "HttpSamplerConfig.vllm_endpoint=generate",
            )
        raw = choice.get("logprobs")
        if path == GENERATE_PATH:
            content = raw.get("content") if isinstance(raw, dict) else None
            logprobs = (
                [e.get("logprob") if isinstance(e, dict) else None for e in content]
                if isinstance(content, list)
                else None
            )
        else:
            logprobs = raw.get("token_logprobs") if isinstance(raw, dict) else None
        if (
            not isinstance(logprobs, list)
            or len(logprobs) != len(ids)
            or not all(isinstance(x, int | float) and not math.isnan(x) for x in logprobs)
        ):
            got = (
                "none"
                if not isinstance(logprobs, list)
                else f"{len(logprobs)} for {len(ids)} tokens"
            )
            raise self.fail(
                server,
                f"the answer to POST {path} lacks per-token logprobs (got {got})",
                "the request asks for logprobs=1; a proxy or an old vLLM dropped them",
            )
        finish = finish_reason_of(choice.get("finish_reason"))
        if finish is None:
            raise self.fail(
                server,
                f"unknown finish_reason {choice.get('finish_reason')!r} in the answer to POST {path}",
                "expected 'stop', 'length' or 'abort'",
            )
        routed = choice.get("routed_experts")
        reported = data.get("weight_version")
        return SampleResult(
            token_ids=ids,
            logprobs=[float(x) for x in logprobs],
            finish_reason=finish,
            weight_version=int(reported) if isinstance(reported, int) else version,
            routed_experts=None if routed is None else {"format": "npy-base64", "data": routed},
        )

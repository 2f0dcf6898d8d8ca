"""Request bodies the local inference server accepts (pydantic, at the HTTP edge only).

Defines ``VllmGenerateRequest`` (``POST /inference/v1/generate``),
``CompletionRequest`` (``POST /v1/completions``), ``SglangGenerateRequest``
(``POST /generate``), ``UpdateWeightsFromDiskRequest`` (SGLang
``POST /update_weights_from_disk``), ``CollectiveRpcRequest`` (vLLM dev-mode
``POST /collective_rpc``) and ``AbortRequest`` (``POST /abort_request``). Field
names and defaults follow the engines' own (vLLM: ``max_tokens`` 16 on
completions; SGLang: ``max_new_tokens`` 128), and unknown fields are ignored
as the engines do, so a client written against them works here unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class VllmSamplingParams(_Body):
    """vLLM ``SamplingParams`` fields the local model honours."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    logprobs: int | None = None
    n: int = 1


class VllmGenerateRequest(_Body):
    """vLLM's tokens-in/tokens-out ``GenerateRequest``."""

    request_id: str | None = None
    token_ids: list[int]
    sampling_params: VllmSamplingParams
    model: str | None = None
    stream: bool = False


class CompletionRequest(_Body):
    """OpenAI completions as vLLM extends them (token-id prompts, ``return_token_ids``)."""

    model: str | None = None
    prompt: list[int] | str
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    logprobs: int | None = None
    return_token_ids: bool = False
    request_id: str | None = None
    stream: bool = False
    n: int = 1


class SglangSamplingParams(_Body):
    """SGLang ``sampling_params`` fields the local model honours."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = None
    n: int = 1


class SglangGenerateRequest(_Body):
    """SGLang's ``GenerateReqInput`` for one prompt."""

    rid: str | None = None
    input_ids: list[int] | None = None
    text: str | None = None
    sampling_params: SglangSamplingParams = SglangSamplingParams()
    return_logprob: bool = False
    stream: bool = False


class UpdateWeightsFromDiskRequest(_Body):
    """SGLang's ``UpdateWeightFromDiskReqInput`` (``POST /update_weights_from_disk``)."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class CollectiveRpcRequest(_Body):
    """vLLM's dev-mode ``POST /collective_rpc`` body."""

    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    timeout: float | None = None


class AbortRequest(_Body):
    """SGLang's ``POST /abort_request`` body."""

    rid: str = ""

"""Sampling from SGLang servers (or an SGLang router) with token ids in and out.

Defines ``SGLangSampler``. It calls ``POST /generate`` the way slime does::

    {"rid": "...", "input_ids": [...], "return_logprob": true,
     "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k", "stop",
                         "stop_token_ids", "sampling_seed", "skip_special_tokens": false,
                         "spaces_between_special_tokens": false, "no_stop_trim": true}}

and reads ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]``
per generated token), ``meta_info.finish_reason.type`` and, when present,
``meta_info.weight_version`` and ``meta_info.routed_experts``.

Weight version: SGLang reports the version ``update_weights_from_disk`` gave
it, as a string, and ``"default"`` for its launch weights. Before any push the
answer's version is trusted (an integer) or replaced by the sampler's; after a
push, a non-integer version (a server that restarted serves its launch
weights) or one older than the version pushed is a mismatch: the answer is
discarded and the server gets no traffic until it is re-pushed
(``HttpSampler.wrong_weights``).

Session affinity: ``X-SMG-Routing-Key`` (sgl-router's consistent-hashing
policy). Cancel: ``POST /abort_request {"rid"}`` on the server that holds the
request, sent in the background when the awaiting task is cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import httpx

from core.http import ShardedClient
from core.samplers.http_pool import ServerState
from core.samplers.http_sampler import HttpSampler, finish_reason_of
from core.types import SampleResult, SamplingParams

__all__ = ["SGLangSampler"]

log = logging.getLogger(__name__)

GENERATE_PATH = "/generate"
ABORT_PATH = "/abort_request"


def _weight_version(value: object) -> int | None:
    """The integer SGLang reports (as a string), None when it is not one (``"default"``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    return None


class SGLangSampler(HttpSampler):
    """``core.interfaces.Sampler`` over one or more SGLang servers (or sgl-router)."""

    protocol: ClassVar[str] = "SGLang"
    affinity_header_name: ClassVar[str] = "X-SMG-Routing-Key"

    def _request(
        self, prompt: Sequence[int], params: SamplingParams, rid: str
    ) -> tuple[str, dict[str, Any]]:
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
        }
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        sampling.update(self.config.extra_sampling_params)
        body: dict[str, Any] = {
            "rid": rid,
            "input_ids": list(prompt),
            "sampling_params": sampling,
            "return_logprob": True,
        }
        if self.config.return_routed_experts:
            body["return_routed_experts"] = True
        return GENERATE_PATH, body

    def _on_cancel(self, client: ShardedClient, server: ServerState, rid: str) -> None:
        self._spawn(self._abort(client, server, rid))

    async def _abort(self, client: ShardedClient, server: ServerState, rid: str) -> None:
        try:
            resp = await client.post(
                server.url + ABORT_PATH,
                json={"rid": rid},
                headers=self._base_headers,
                timeout=self.config.abort_timeout_s,
            )
        except httpx.HTTPError as exc:
            # The request is gone from our side either way; the engine finishes it unseen.
            self._log_abort_failure(server, rid, f"{type(exc).__name__}: {exc}")
            return
        if resp.status_code >= 300:
            self._log_abort_failure(server, rid, f"HTTP {resp.status_code}")

    def _log_abort_failure(self, server: ServerState, rid: str, why: str) -> None:
        log.warning(
            "SGLang server %s: abort of %s failed (%s); it generates to the end",
            server.url,
            rid,
            why,
        )

    def _not_found_fix(self) -> str:
        return "check that HttpSamplerConfig.urls points at the SGLang server or router root URL (it serves POST /generate)"

    def _parse(self, server: ServerState, data: Any, params: SamplingParams, version: int) -> SampleResult:
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            raise self.fail(
                server,
                f"the answer to POST /generate has no meta_info: {str(data)[:200]!r}",
                "check that HttpSamplerConfig.urls points at an SGLang server",
            )
        pairs = meta.get("output_token_logprobs")
        if not isinstance(pairs, list):
            raise self.fail(
                server,
                "the answer to POST /generate has no meta_info.output_token_logprobs",
                "the request sets return_logprob=true; a router or an old SGLang dropped them",
            )
        try:
            logprobs = [float(p[0]) for p in pairs]
            ids = [p[1] for p in pairs]
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise self.fail(
                server,
                f"malformed meta_info.output_token_logprobs ({exc}): {str(pairs)[:120]!r}",
                "expected [logprob, token_id, text] per generated token",
            ) from exc
        if not all(type(t) is int for t in ids) or any(math.isnan(x) for x in logprobs):
            raise self.fail(
                server,
                f"meta_info.output_token_logprobs holds non-integer ids or NaN logprobs: {str(pairs)[:120]!r}",
                "expected [logprob, token_id, text] per generated token",
            )
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        finish = finish_reason_of(kind)
        if finish is None:
            raise self.fail(
                server,
                f"unknown meta_info.finish_reason {reason!r}",
                "expected type 'stop', 'length' or 'abort'",
            )
        reported = meta.get("weight_version")
        served = _weight_version(reported)
        if self.pushed and reported is not None and (served is None or served < version):
            raise self.wrong_weights(server, f"answered with meta_info.weight_version={reported!r}")
        routed = meta.get("routed_experts")
        return SampleResult(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            weight_version=version if served is None else served,
            routed_experts=None
            if routed is None
            else {
                "format": "int32-base64",
                "data": routed,
                "start_len": meta.get("routed_experts_start_len"),
            },
        )

"""The gateway's sampler inside verl: ``LLMServerClient.generate`` behind ``core.interfaces.Sampler``.

Defines ``VerlSampler`` and the pure helpers it uses (``verl_sampling_params``,
``infer_finish_reason``).

One ``VerlSampler`` serves every gateway session of one AgentLoopWorker. Each
call goes to verl's client with the gateway session id as the sticky key, so
all turns of a session land on one replica (prefix cache hits), exactly as
verl's own agent loops do with their request id. What comes back is a
``TokenOutput``; we map it to ``SampleResult``:

- finish reason: verl's vLLM server collapses ``stop`` and ``length`` into
  ``completed``; we infer ``length`` when the turn used its whole
  ``max_tokens`` without ending on a stop token, else ``stop``. SGLang's raw
  ``stop``/``length``/``abort`` pass through. ``aborted`` raises
  ``SamplerError`` (the gateway answers 503 and records nothing).
- weight version: ``extra_fields["global_steps"]``, the version verl stamps
  when it syncs weights; the per-session min/max (for verl's staleness tags)
  are kept in ``steps_for(session_id)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import SamplerError
from core.types import FinishReason, SampleResult, SamplingParams


@dataclass
class SessionSteps:
    """Weight versions one session's turns were sampled with (verl's ``min/max_global_steps``)."""

    min_global_steps: int
    """Oldest weights any turn of the session used."""
    max_global_steps: int
    """Newest weights any turn used."""
    missing_logprobs: bool = False
    """True when the server returned no logprobs (``rollout.calculate_log_probs=false``)."""

    def add(self, step: int) -> None:
        self.min_global_steps = min(self.min_global_steps, step)
        self.max_global_steps = max(self.max_global_steps, step)


def verl_sampling_params(
    params: SamplingParams, rollout_name: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``sampling_params`` dict verl's rollout servers accept for ``params``.

    vLLM's server feeds unknown keys into ``vllm.SamplingParams(**...)`` and SGLang's
    into its sampling dict, so only keys both understand are sent (``seed`` only to
    vLLM). ``logprobs`` asks for the sampled token's logprob.

    Args:
        params: The gateway's per-turn settings.
        rollout_name: ``actor_rollout_ref.rollout.name``.
        extra: verl's per-trajectory extras (``repetition_penalty``), sent unchanged.
    """
    out: dict[str, Any] = dict(extra or {})
    out.update(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        logprobs=True,
    )
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None and rollout_name == "vllm":
        out["seed"] = params.seed
    return out


def infer_finish_reason(
    stop_reason: str | None,
    token_ids: Sequence[int],
    params: SamplingParams,
    stop_ids: frozenset[int],
) -> FinishReason:
    """Our finish reason for a ``TokenOutput.stop_reason``.

    Raises:
        SamplerError: the request was aborted (weights swapped under it, shutdown).
    """
    if stop_reason in ("aborted", "abort"):
        raise SamplerError(
            "verl aborted the generation (weights were being updated or the server shut down); "
            "the agent may retry the request"
        )
    if stop_reason == "length":
        return FinishReason.LENGTH
    if stop_reason == "stop":
        return FinishReason.STOP
    ends_on_stop = bool(token_ids) and (
        token_ids[-1] in stop_ids or token_ids[-1] in params.stop_token_ids
    )
    if len(token_ids) >= params.max_tokens and not ends_on_stop:
        return FinishReason.LENGTH
    return FinishReason.STOP


class VerlSampler:
    """``core.interfaces.Sampler`` over verl's ``LLMServerClient`` (Ray, not HTTP).

    Args:
        client: verl's ``LLMServerClient`` (or anything with its ``generate``).
        rollout_name: ``actor_rollout_ref.rollout.name`` (decides which keys are sent).
        stop_ids: End-of-sequence token ids of the tokenizer.
        default_global_steps: Weight version to report when the server stamps none.
    """

    def __init__(
        self,
        client: Any,
        *,
        rollout_name: str,
        stop_ids: frozenset[int],
        default_global_steps: int = 0,
    ) -> None:
        self.client = client
        self.rollout_name = rollout_name
        self.stop_ids = stop_ids
        self.default_global_steps = default_global_steps
        self.extra_params: dict[str, Any] = {}
        self._steps: dict[str, SessionSteps] = {}

    def steps_for(self, session_id: str) -> SessionSteps | None:
        """Weight versions seen by ``session_id`` so far (None before its first turn)."""
        return self._steps.get(session_id)

    def forget(self, session_id: str) -> SessionSteps | None:
        """Drop and return the record of ``session_id`` (call when the session ends)."""
        return self._steps.pop(session_id, None)

    async def sample(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> SampleResult:
        """Generate one turn through verl; see ``core.interfaces.Sampler``.

        Raises:
            SamplerError: verl raised, aborted, or returned malformed output.
        """
        request = verl_sampling_params(params, self.rollout_name, self.extra_params)
        try:
            out = await self.client.generate(
                session_id, prompt_ids=list(prompt_token_ids), sampling_params=request
            )
        except SamplerError:
            raise
        except Exception as exc:
            raise SamplerError(
                f"verl's LLMServerClient.generate failed for session {session_id[:10]!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        token_ids = list(out.token_ids)
        reason = infer_finish_reason(out.stop_reason, token_ids, params, self.stop_ids)
        if len(token_ids) > params.max_tokens:
            raise SamplerError(
                f"verl returned {len(token_ids)} tokens for max_tokens={params.max_tokens}; "
                "the rollout server ignored the limit"
            )
        extra = out.extra_fields or {}
        step = extra.get("global_steps")
        version = int(step) if step is not None else self.default_global_steps
        lo = extra.get("min_global_steps")
        hi = extra.get("max_global_steps")
        record = self._steps.get(session_id)
        if record is None:
            record = self._steps[session_id] = SessionSteps(version, version)
        record.add(version)
        if lo is not None:
            record.add(int(lo))
        if hi is not None:
            record.add(int(hi))
        if out.log_probs is None:
            record.missing_logprobs = True
            logprobs = [0.0] * len(token_ids)
        else:
            logprobs = [float(x) for x in out.log_probs]
            if len(logprobs) != len(token_ids):
                raise SamplerError(
                    f"verl returned {len(token_ids)} tokens but {len(logprobs)} logprobs "
                    f"for session {session_id[:10]!r}"
                )
        return SampleResult(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=reason,
            weight_version=version,
            routed_experts=out.routed_experts,
        )

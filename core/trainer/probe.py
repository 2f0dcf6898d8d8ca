"""Does the fleet report the trainer's logprobs? A probe on a fixed prompt, per server.

The loss compares the logprobs each turn recorded (the inference server's) with
the trainer's for the same tokens. Engines report logprobs of another
distribution than they sample from unless told otherwise (vLLM: the raw
model's, before temperature, top-k and top-p; SGLang: after temperature,
before top-k/top-p renormalisation), and a server can hold other weights or
another dtype than the trainer: then the ratio is wrong on every token, and
our own learning test shows that to be fatal. So, at start-up and after each
push, every server samples a fixed prompt at the loss's settings with a fixed
seed, the backend scores those tokens (its ``forward``, Tinker's forward
without a gradient), and a server whose mean absolute difference per token
passes ``sampler.logprob_tolerance`` is refused.

Defines:

- ``ProbeResult``: one server's comparison.
- ``check_unnormalised``: refuse at start-up the sampling settings an engine
  reports unnormalised logprobs for, unless ``sampler.processed_logprobs`` says
  the servers were started to report the sampled distribution's.
- ``probe_server``: sample on one server, score with the backend, compare.
- ``reprobe_server``: a server readmitted between pushes (back from unhealthy,
  re-pushed) against a passed probe's trainer logprobs, so the trainer (whose
  weights may already be past the pushed ones) is not asked again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.samplers.http_pool import ServerState
from core.samplers.http_sampler import HttpSampler
from core.types import Datum, SamplingParams

__all__ = ["PROBE_TEXT", "ProbeResult", "check_unnormalised", "probe_server", "reprobe_server"]

PROBE_TEXT = "Count on from one: one, two, three,"
"""The fixed prompt (encoded with the run's tokenizer, no special tokens)."""
PROBE_SEED = 20_240_601
PROBE_TOKENS = 16


@dataclass(frozen=True)
class ProbeResult:
    """One server's logprobs against the trainer's on the probe's tokens."""

    url: str
    """The server probed."""
    tokens: int
    """Tokens it generated (0: nothing to compare)."""
    mean_abs_diff: float
    """Mean |server - trainer| logprob per generated token."""
    max_abs_diff: float
    """Largest |server - trainer| over the generated tokens."""
    token_ids: tuple[int, ...] = ()
    """The tokens the server sampled."""
    trainer_logprobs: tuple[float, ...] = ()
    """The trainer's logprobs for them (what ``reprobe_server`` compares with)."""


def check_unnormalised(kind: str, params: SamplingParams, *, processed_logprobs: bool) -> None:
    """Refuse settings ``kind``'s engine reports logprobs of another distribution for.

    Raises:
        ConfigError: naming the setting, what the engine reports, and the fixes.
    """
    if processed_logprobs:
        return
    asked = []
    if kind == "vllm" and params.temperature != 1.0:
        asked.append(f"algorithm.temperature={params.temperature!r}")
    if params.top_p < 1.0:
        asked.append(f"algorithm.loss_config.top_p={params.top_p!r}")
    if params.top_k > 0:
        asked.append(f"algorithm.loss_config.top_k={params.top_k!r}")
    if not asked:
        return
    reports = (
        "vLLM reports the raw model's logprobs (before temperature, top-k and top-p) unless started "
        "with --logprobs-mode processed_logprobs"
        if kind == "vllm"
        else "SGLang reports logprobs after temperature but before top-k/top-p renormalisation"
    )
    raise ConfigError(
        f"sampler={kind} with {', '.join(asked)}: {reports}, so every ratio in the loss would compare "
        "two different distributions. Sample at temperature 1 without top-k/top-p, or start the servers "
        "to report the logprobs of the distribution they sample from and declare it with "
        "sampler.processed_logprobs=true (the logprob probe checks the claim at start-up; docs/samplers.md)"
    )


def probe_prompt(tokenizer: Any) -> list[int]:
    """``PROBE_TEXT`` in the run's tokenizer."""
    ids = [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]
    return ids or [0]


async def probe_server(
    sampler: HttpSampler,
    server: ServerState,
    backend: Any,
    loss: tuple[str, dict[str, float]],
    params: SamplingParams,
) -> ProbeResult:
    """Sample the probe prompt on ``server`` at ``params`` and compare its logprobs with
    ``backend.forward``'s for the same tokens under ``loss`` (``algorithm.loss`` and the
    ``loss_config`` the loop trains with)."""
    prompt = probe_prompt(backend.get_tokenizer())
    result = await sampler.sample_on(server, prompt, _probe_params(params))
    generated = list(result.token_ids)
    if not generated:
        return ProbeResult(server.url, 0, 0.0, 0.0)
    sequence = prompt + generated
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(generated)
    datum = Datum(
        model_input=sequence[:-1],
        target_tokens=sequence[1:],
        logprobs=[0.0] * (len(prompt) - 1) + list(result.logprobs),
        advantages=[0.0] * len(weights),
        weights=weights,
    )
    loss_fn, loss_config = loss
    scored = await backend.forward([datum], loss_fn, loss_config)
    trainer = list(scored.logprobs[0])[-len(generated) :]
    diffs = _diffs(result.logprobs, trainer)
    return ProbeResult(
        server.url, len(generated), sum(diffs) / len(diffs), max(diffs), tuple(generated), tuple(trainer)
    )


async def reprobe_server(
    sampler: HttpSampler, server: ServerState, reference: ProbeResult, prompt: Sequence[int], params: SamplingParams
) -> ProbeResult | None:
    """Sample the probe prompt on ``server`` at ``params`` and compare its logprobs with
    ``reference``'s trainer logprobs (a probe that passed at the current version). None
    when it sampled other tokens than ``reference`` (same seed and settings: other weights,
    or an engine that is not deterministic), which this cannot score."""
    result = await sampler.sample_on(server, list(prompt), _probe_params(params))
    if tuple(result.token_ids) != reference.token_ids or not reference.token_ids:
        return None
    diffs = _diffs(result.logprobs, reference.trainer_logprobs)
    return ProbeResult(
        server.url, len(diffs), sum(diffs) / len(diffs), max(diffs), reference.token_ids, reference.trainer_logprobs
    )


def _probe_params(params: SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=PROBE_TOKENS,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=PROBE_SEED,
    )


def _diffs(server: Sequence[float], trainer: Sequence[float]) -> list[float]:
    return [abs(float(a) - float(b)) for a, b in zip(server, trainer, strict=True)]

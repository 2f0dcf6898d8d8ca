"""The run's guards: checks that stop a run before it wastes time or mixes runs.

- ``check_fresh_run_dir``: a fresh run refuses a ``run_dir`` holding an earlier
  run's checkpoints or metrics;
- ``check_canary``: the canary rollout reached the gateway and returned a reward;
- ``check_failures``: a step's rollout failure rate is within ``trainer.max_failure_rate``;
- ``check_certificate``: the model's chat template certifies (``core.gateway.certify``): its
  traces equal what the template renders, or the run says it accepts that they may not;
- ``check_policy_support``: a run with several ``policies`` has a backend that trains them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError, RunAborted
from core.rollout import RolloutOutcome
from core.rundir.checkpoint import existing_checkpoints
from core.types import RolloutStatus

if TYPE_CHECKING:
    from core.gateway.certify import Certificate
    from core.plugins import BackendSpec


def check_policy_support(policies: Sequence[str], spec: BackendSpec) -> None:
    """Refuse ``policies`` with more than one entry for a backend that trains one policy:
    it would train every role's turns into one model, the very thing several policies are
    configured to avoid, and say nothing."""
    if len(policies) > 1 and not spec.multi_policy:
        raise ConfigError(
            f"policies configures {len(policies)} policies {list(policies)}, but backend {spec.name!r} "
            "trains one policy per run (its BackendSpec does not declare multi_policy=True); it would "
            "train every policy's turns into one model. Keep at most one entry in policies, or train on "
            "a backend that declares it, such as backend=local (docs/multi_agent.md)"
        )


def check_fresh_run_dir(run_dir: Path) -> None:
    """Refuse to start a fresh run where an earlier run left checkpoints or metrics."""
    found = existing_checkpoints(run_dir)
    if found:
        raise ConfigError(
            f"run_dir {run_dir} already holds checkpoints ({found[-1].name} and "
            f"{len(found) - 1} more) of an earlier run; pass trainer.resume=true to continue "
            "it, or choose a new run_dir (a fresh run there would mix its metrics and "
            "checkpoints with the old ones)"
        )
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:
        raise ConfigError(
            f"run_dir {run_dir} already holds {metrics.name} of an earlier run that "
            "saved no checkpoint; choose a new run_dir, or delete that file to start over "
            "there (a fresh run would append its steps to the old run's metrics)"
        )


def check_canary(outcome: RolloutOutcome) -> None:
    """Abort unless the canary rollout made a model call and came back ``ok``."""
    result = outcome.result
    if result.status is RolloutStatus.NO_MODEL_CALLS:
        raise RunAborted(
            "canary rollout returned a reward but made no model call through the gateway: "
            "the agent must send its requests to payload['_config']['base_url'] with "
            "payload['_config']['api_key'] as its API key; training on it would learn nothing"
        )
    if result.status is not RolloutStatus.OK:
        error = (result.error or "no error text").strip()
        if "context_length_exceeded" in error or "maximum context length" in error:
            advice = (
                "The agent's conversation does not fit the context the error names: raise that "
                "setting (the tiny model's backend.tiny.max_position_embeddings, the gateway's "
                "gateway.max_context_tokens), or shorten the agent's prompt; each turn adds up "
                "to algorithm.max_tokens tokens."
            )
        else:
            advice = (
                "Check that the agent starts (task.agent), reaches the gateway at the base_url "
                "it is given, and returns {'reward': <float>}."
            )
        raise RunAborted(
            f"canary rollout failed with status {result.status.value!r}: {error[-2000:]}\n{advice}"
        )


def check_failures(outcomes: list[RolloutOutcome], *, step: int, max_failure_rate: float) -> Counter[str]:
    """The step's status counts; aborts when more than ``max_failure_rate`` of them failed."""
    statuses = Counter(o.result.status.value for o in outcomes)
    failed = sum(n for s, n in statuses.items() if s != RolloutStatus.OK.value)
    rate = failed / max(1, len(outcomes))
    if rate > max_failure_rate:
        errors = [o.result.error for o in outcomes if o.result.error][:3]
        raise RunAborted(
            f"step {step}: {failed} of {len(outcomes)} rollouts failed "
            f"({rate:.0%} > trainer.max_failure_rate={max_failure_rate}); statuses: "
            f"{dict(statuses)}; first errors: {errors}"
        )
    return statuses


def check_certificate(cert: Certificate, *, allow: bool) -> str | None:
    """Refuse a chat template whose traces would not be exact; returns the line to print
    (a summary when some cases fork, a warning when a failing template is allowed), or None.

    Raises:
        ConfigError: a case fails and ``gateway.allow_uncertified_template`` is off.
    """
    if cert.verdict == "fails":
        bad = cert.failing()
        name = f"case {bad[0].name!r} ({bad[0].what})" if bad else "the end-of-turn check"
        detail = bad[0].detail if bad else "no token id stops generation (set the eos token or generation config)"
        if not allow:
            names = ", ".join(c.name for c in bad)
            raise ConfigError(
                f"the model's chat template does not certify: {name} fails: {detail}"
                + (f" (failing cases: {names})" if len(bad) > 1 else "")
                + ". Traces recorded with it would not be what the template renders, so the model would be "
                "trained on contexts it never sees when served. See the table with `python -m core.gateway "
                "certify MODEL`, fix the template, or set gateway.allow_uncertified_template=true to train anyway"
            )
        return f"warning: training with an uncertified chat template (gateway.allow_uncertified_template): {name} fails: {detail}"
    if cert.verdict == "forks":
        return cert.summary()
    return None

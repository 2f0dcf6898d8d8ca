"""The run's guards: checks that stop a run before it wastes time or mixes runs.

- ``check_fresh_run_dir``: a fresh run refuses a ``run_dir`` holding an earlier
  run's checkpoints or metrics;
- ``check_canary``: the canary rollout reached the gateway and returned a reward;
- ``check_failures``: a step's rollout failure rate is within ``trainer.max_failure_rate``;
- ``check_policy_support``: a run with several ``policies`` has a backend that trains them;
- ``check_policy_settings``: a policy's own settings go to a backend that applies them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, RunAborted
from core.plugins.policy_backend import policy_backend_config
from core.rollout import RolloutOutcome
from core.rundir.checkpoint import existing_checkpoints
from core.trainer.policy_config import PolicyConfig
from core.types import RolloutStatus

if TYPE_CHECKING:
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


def check_policy_settings(cfg: Any, policies: Mapping[str, PolicyConfig], spec: BackendSpec) -> None:
    """Refuse, before anything starts, a policy's own settings its backend would not apply:
    ``backend`` keys the backend does not let a policy set, or cannot honour
    (``policy_backend_config``), and ``algorithm`` settings (learning rate, loss, sampling) on a
    backend that runs its own trainer (verl, slime), which reads ``algorithm`` only."""
    for name, policy in policies.items():
        policy_backend_config(cfg, name, policy.backend, spec, algorithm=policy.algorithm_settings())
    if spec.kind == "driven":
        return
    for name, policy in policies.items():
        own = sorted(policy.algorithm_settings())
        if own:
            raise ConfigError(
                f"policies.{name} sets {own}, but backend {spec.name!r} runs its own trainer, which "
                f"reads algorithm.* and no policy's own settings; set them as algorithm.{own[0]}=... "
                "or train on a backend core drives (backend=local or tinker; docs/multi_agent.md)"
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

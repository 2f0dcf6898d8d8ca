"""The trained policies of one run: a backend per policy, for backends that declare
``multi_policy`` (docs/multi_agent.md).

Defines:

- ``build_policy_backend``: a policy's backend, built with its own settings;
- ``PolicyBackends``: the run's policies by name, each with its own backend (weights,
  optimizer state, sampler and weight version; the loop builds one with the backend's
  factory per policy, so each starts from the same weights), saved and restored together;
- ``check_policy_modes``: refuses settings that cannot serve several policies yet (a fleet);
- ``policy_metrics``: a step's ``policy/<name>/*`` metrics, its staleness read against
  its own version.
- ``session_sampling``: a session's sampling defaults, each policy's own where its settings
  differ from the default policy's (``SamplingParams.by_policy``), and ``loss_samplings``:
  the distribution each policy's loss assumes its turns were drawn from.

Why a backend per policy: the loop's training primitives (``forward_backward``,
``optim_step``, ``sync_sampler``, ``save_state``) already describe one policy, so a
policy per role needs no new backend API, only one instance per role. One policy (a run
without ``policies``) is exactly today's run: one backend, checkpointed where it always was.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError
from core.plugins.policy_backend import policy_backend_config
from core.trainer.overrides import LossSampling, loss_sampling
from core.trainer.pool import token_staleness, trains
from core.types import PolicySampling, SamplingParams

if TYPE_CHECKING:
    from core.plugins import BackendSpec
    from core.rollout import RolloutOutcome
    from core.trainer.policy_config import PolicyConfig
    from core.trainer.signal import StepSignal

__all__ = [
    "PolicyBackends",
    "build_policy_backend",
    "check_policy_modes",
    "loss_samplings",
    "policy_metrics",
    "session_sampling",
]


def build_policy_backend(spec: BackendSpec, cfg: Any, name: str, policy: PolicyConfig | None) -> Any:
    """Policy ``name``'s backend: ``spec.factory`` on the run's config with the policy's own
    ``backend`` and ``algorithm`` settings in it (``policy_backend_config``).

    Raises:
        ConfigError: a setting the backend refuses, naming the policy when it set any.
    """
    own = policy.algorithm_settings() if policy is not None else {}
    built = policy_backend_config(cfg, name, policy.backend if policy is not None else None, spec, algorithm=own)
    try:
        return spec.factory(built)
    except ConfigError as exc:
        if built is cfg:
            raise
        raise ConfigError(f"policies.{name} (with its own settings): {exc}") from None


def _sampled_with(algo: Any, *, evaluation: bool) -> PolicySampling:
    """What a policy with ``algorithm`` ``algo`` samples its turns with."""
    loss = loss_sampling(algo)
    return PolicySampling(
        temperature=float(algo.eval_temperature if evaluation else algo.temperature),
        top_p=loss.top_p,
        top_k=loss.top_k,
        max_tokens=int(algo.max_tokens),
    )


def session_sampling(algos: Mapping[str, Any], *, evaluation: bool, seed: int | None) -> SamplingParams:
    """A rollout session's sampling defaults for a run whose policies have ``algos`` (each
    policy's ``algorithm``, the default policy first): the default policy's settings (its
    ``temperature``, or ``eval_temperature`` in an evaluation, ``max_tokens`` and its loss's
    ``top_p``/``top_k``), and in ``by_policy`` every other policy whose own differ.
    """
    names = list(algos)
    base = _sampled_with(algos[names[0]], evaluation=evaluation)
    own = {name: _sampled_with(algos[name], evaluation=evaluation) for name in names[1:]}
    return SamplingParams(
        max_tokens=base.max_tokens,
        temperature=base.temperature,
        top_p=base.top_p,
        top_k=base.top_k,
        seed=seed,
        by_policy=tuple((name, mine) for name, mine in own.items() if mine != base),
    )


def loss_samplings(algos: Mapping[str, Any]) -> dict[str, LossSampling]:
    """Each policy's turns as its loss assumes they were sampled: its loss's ``top_p``/``top_k``
    at the temperature its sessions sample with (``algorithm.temperature``, its own when set).

    Compared with what the sessions sample at, not a ``loss_config.temperature`` set apart from
    it: that is the run's own setting, seen in lp-gap, and masking every turn for it would
    silently train nothing.
    """
    return {name: replace(loss_sampling(algo), temperature=float(algo.temperature)) for name, algo in algos.items()}


def check_policy_modes(policies: Sequence[str], *, sampler: str) -> None:
    """Refuse several policies with an inference-server fleet: a fleet serves one set of
    weights (one weight push). ``trainer.mode=async`` trains several: its staleness is each
    turn's against its own policy's version (``core.trainer.pool.Versions``)."""
    if len(policies) > 1 and sampler != "backend":
        raise ConfigError(
            f"policies configures {len(policies)} policies {list(policies)}, but sampler={sampler!r} serves "
            "one set of weights; use sampler=backend, which samples each policy with its own weights "
            "(docs/multi_agent.md)"
        )


class PolicyBackends:
    """A backend per policy, by name; the first is the run's default policy.

    With one policy this is the run's only backend, and its checkpoint is the backend's
    own ``save_state`` directory, as before policies existed.
    """

    def __init__(self, backends: dict[str, Any]) -> None:
        if not backends:
            raise ConfigError("a run trains at least one policy")
        self.backends = dict(backends)

    @property
    def default(self) -> Any:
        """The first policy's backend (the gateway's tokenizer and model id come from it)."""
        return next(iter(self.backends.values()))

    @property
    def names(self) -> list[str]:
        return list(self.backends)

    @property
    def several(self) -> bool:
        return len(self.backends) > 1

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.backends.items())

    def __getitem__(self, name: str) -> Any:
        return self.backends[name]

    def versions(self) -> dict[str, int]:
        """Each policy's weight version."""
        return {name: int(b.weight_version) for name, b in self.backends.items()}

    async def save(self, path: Path) -> dict[str, Any]:
        """Save every policy under ``path``; returns the checkpoint state's backend entries.

        One policy: ``{"backend_path": ...}`` (its ``save_state`` directory is ``path``).
        Several: each in ``path/<name>``, ``backend_path`` is ``path`` (so the checkpoint's
        file sizes cover them all) and ``policies`` maps each name to its directory.
        """
        if not self.several:
            return {"backend_path": await self.default.save_state(str(path))}
        where = {name: await b.save_state(str(path / name)) for name, b in self.backends.items()}
        return {"backend_path": str(path), "policies": where}

    async def load(self, state: dict[str, Any]) -> None:
        """Restore what ``save`` wrote into a checkpoint's ``state``.

        Raises:
            ConfigError: the checkpoint holds other policies than this run configures.
        """
        saved = state.get("policies")
        names = sorted(saved) if isinstance(saved, dict) else None
        if not self.several:
            if names is not None and len(names) > 1:
                raise ConfigError(
                    f"the checkpoint holds policies {names}, but this run trains one; resume with the "
                    "same policies configured (+policies.<name>={} for each; docs/multi_agent.md)"
                )
            path = saved[names[0]] if saved and names else state["backend_path"]
            await self.default.load_state(str(path))
            return
        if names != sorted(self.backends):
            found = names if names is not None else "one policy"
            raise ConfigError(
                f"the checkpoint holds {found}, but this run configures policies {sorted(self.backends)}; "
                "resume with the policies the run was started with (docs/multi_agent.md)"
            )
        assert isinstance(saved, dict)
        for name, backend in self.backends.items():
            await backend.load_state(str(saved[name]))


def _policy_rows(outcomes: Sequence[RolloutOutcome], policy: str) -> list[RolloutOutcome]:
    """``outcomes`` that have rows of ``policy``, each with only those rows."""
    out = []
    for o in outcomes:
        rows = [r for r in o.rows if r.policy() == policy]
        if rows:
            out.append(replace(o, rows=rows))
    return out


def policy_metrics(
    outcomes: Sequence[RolloutOutcome],
    signal: StepSignal,
    before: Mapping[str, int],
    after: Mapping[str, int],
    *,
    exclude_failed: bool = True,
) -> dict[str, float]:
    """``policy/<name>/*`` of one step, for every policy (NaN where it had nothing):

    - ``reward``: mean over the ``ok`` rollouts with a turn of the policy, of the rollout's
      role reward for it when it returned one, else of its reward; ``rollouts`` counts them;
    - ``turns`` its turns, ``tokens`` its trained tokens (loss weight);
    - ``staleness_mean`` / ``staleness_max``: optimizer steps of the policy between the weights
      that sampled each of its trained tokens and those it trained (``before``), over the
      rollouts that train (``ok``, and failed ones with rows when ``exclude_failed`` is False);
    - ``weight_version`` after the step (``after``).

    The step's ``async/*staleness*`` are ``core.trainer.metrics.flow_metrics``'s, which read
    each turn against its own policy's version too.
    """
    out: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for datum, policy in zip(signal.datums, signal.policies, strict=True):
        tokens[policy] = tokens.get(policy, 0.0) + sum(datum.weights)
    ok = [o for o in outcomes if o.ok]
    trained = [o for o in outcomes if trains(o, exclude_failed=exclude_failed)]
    for name, version in before.items():
        mine = _policy_rows(ok, name)
        aged = _policy_rows(trained, name)
        rewards = [o.result.role_rewards.get(name, float(o.result.reward or 0.0)) for o in mine]
        mean, worst = token_staleness(aged, version)
        out.update({
            f"policy/{name}/reward": sum(rewards) / len(rewards) if rewards else math.nan,
            f"policy/{name}/rollouts": float(len(mine)),
            f"policy/{name}/turns": float(sum(len(r.turns) for o in mine for r in o.rows)),
            f"policy/{name}/tokens": tokens.get(name, 0.0),
            f"policy/{name}/staleness_mean": mean if aged else math.nan,
            f"policy/{name}/staleness_max": float(worst) if aged else math.nan,
            f"policy/{name}/weight_version": float(after[name]),
        })
    return out

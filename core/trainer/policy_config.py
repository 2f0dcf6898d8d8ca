"""One entry of ``policies``: what a policy answers to and the settings it trains with.

Defines:

- ``PolicyConfig``: a policy's settings (its ``algorithm`` ones and its ``backend`` ones), read with pydantic at the config's edge (an unknown
  key or a value of the wrong type is refused naming the policy and the key);
- ``read_policies``: the composed ``policies`` node as ``PolicyConfig`` by name;
- ``ALGORITHM_KEYS``: the ``algorithm`` settings a policy may set for itself;
- ``policy_algorithm``: a policy's ``algorithm``, the run's with the policy's own settings
  over it, checked as the run's is.

Why per-policy settings replace, not merge: a policy's ``loss_config`` is the whole of that
policy's loss settings (so a policy may drop a clip key the run's loss needs), and every
setting a policy leaves out is the run's (docs/multi_agent.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Algorithm = TypeVar("_Algorithm", bound="DataclassInstance")

__all__ = ["ALGORITHM_KEYS", "PolicyConfig", "policy_algorithm", "read_policies"]

ALGORITHM_KEYS = (
    "learning_rate",
    "beta1",
    "beta2",
    "weight_decay",
    "grad_clip_norm",
    "loss",
    "loss_config",
    "temperature",
    "eval_temperature",
    "max_tokens",
)
"""``algorithm`` settings a policy may set for itself: its optimizer (each policy has its own
optimizer state), its loss and the sampling its turns are drawn with. The advantage settings
(``normalize_std``, ``std``, ...) stay the run's: a group's rollouts span every policy."""


class PolicyConfig(BaseModel):
    """One entry of ``policies``: a policy the gateway routes turns to and its own settings.

    Every setting left out (None) is the run's ``algorithm`` one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[str] = Field(default_factory=list)
    """Model names (the ``model`` an agent's request sends) routed to this policy, besides
    the policy's own name."""
    learning_rate: float | None = Field(None, gt=0)
    """Adam step size of this policy's optimizer (``algorithm.learning_rate``)."""
    beta1: float | None = Field(None, ge=0, lt=1)
    """Adam beta1 (``algorithm.beta1``)."""
    beta2: float | None = Field(None, ge=0, lt=1)
    """Adam beta2 (``algorithm.beta2``)."""
    weight_decay: float | None = Field(None, ge=0)
    """Decoupled weight decay (``algorithm.weight_decay``)."""
    grad_clip_norm: float | None = Field(None, ge=0)
    """Gradient-norm clip of this policy's update (``algorithm.grad_clip_norm``)."""
    loss: str | None = None
    """This policy's loss: cross_entropy, importance_sampling, ppo or cispo (``algorithm.loss``)."""
    loss_config: dict[str, float] | None = None
    """This policy's loss settings; replaces ``algorithm.loss_config`` whole (not merged).
    Its ``top_p`` / ``top_k`` are this policy's sampling truncation, as the run's are."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature of this policy's turns in training rollouts, and the temperature its
    loss scores them at (``algorithm.temperature``)."""
    eval_temperature: float | None = Field(None, ge=0)
    """Sampling temperature of this policy's turns in evaluations (``algorithm.eval_temperature``)."""
    max_tokens: int | None = Field(None, ge=1)
    """Most tokens this policy generates per turn (``algorithm.max_tokens``)."""
    backend: dict[str, Any] = Field(default_factory=dict)
    """This policy's own settings of the run's ``backend`` node (its LoRA rank, ...), merged
    over it; the keys a backend takes are its ``BackendSpec.policy_settings``
    (``core.plugins.policy_backend``)."""

    def algorithm_settings(self) -> dict[str, Any]:
        """The ``algorithm`` settings this policy sets (those it leaves out are the run's)."""
        return {k: v for k, v in self.model_dump(include=set(ALGORITHM_KEYS)).items() if v is not None}


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _explain(name: str, exc: ValidationError) -> ConfigError:
    """``exc`` worded for the user: each problem with the policy, the key and what to do."""
    known = ", ".join(PolicyConfig.model_fields)
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"policies.{name}.{key}: unknown setting; a policy takes {known}")
        else:
            lines.append(f"policies.{name}.{key}: {err['msg']}, got {err.get('input')!r}")
    return ConfigError("; ".join(lines) + " (docs/multi_agent.md)")


def read_policies(node: Any) -> dict[str, PolicyConfig]:
    """The composed ``policies`` node as ``PolicyConfig`` by name, in the order given.

    Raises:
        ConfigError: an entry that is not a mapping, an unknown setting or a bad value,
            naming the policy and the key.
    """
    out: dict[str, PolicyConfig] = {}
    for name, entry in (_plain(node) or {}).items():
        if isinstance(entry, PolicyConfig):
            out[str(name)] = entry
            continue
        body = entry if entry is not None else {}
        if not isinstance(body, Mapping):
            raise ConfigError(
                f"policies.{name} must be a mapping of settings (or {{}}), got {body!r} (docs/multi_agent.md)"
            )
        try:
            out[str(name)] = PolicyConfig.model_validate(dict(body))
        except ValidationError as exc:
            raise _explain(str(name), exc) from None
    return out


def policy_algorithm(algo: _Algorithm, name: str, policy: PolicyConfig | None) -> _Algorithm:
    """Policy ``name``'s ``algorithm``: ``algo`` (the run's ``AlgorithmConfig``) with ``policy``'s own settings over it, checked
    as the run's is (a loss and loss settings that disagree are refused naming the policy).

    Raises:
        ConfigError: the combination is one the run's ``algorithm`` would be refused for.
    """
    changes = policy.algorithm_settings() if policy is not None else {}
    if not changes:
        return algo
    try:
        return dataclasses.replace(algo, **changes)
    except ConfigError as exc:
        raise ConfigError(
            f"policies.{name} (its {sorted(changes)} over the run's algorithm): {exc}"
        ) from None

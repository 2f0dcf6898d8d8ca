"""A policy's own backend settings: ``policies.<name>.backend``, over the run's ``backend``.

Defines:

- ``setting_keys``: a nested mapping of settings as the dotted keys it sets;
- ``check_policy_tokenizers``: every policy's model reads the default policy's tokens (the
  gateway renders every turn with that one tokenizer), for a policy with a model of its own;
- ``policy_backend_config``: the composed config a policy's backend is built from: the run's,
  with the policy's ``backend`` settings merged over its ``backend`` node, after checking
  each key is one the backend lets a policy set (``BackendSpec.policy_settings``) and the
  result is one it can honour (``BackendSpec.check_policy``).

Why here, below the trainer: ``python -m core.eval`` builds a backend per policy exactly as
training does, so a checkpoint of a policy with its own adapter rank loads into an adapter
of that rank (docs/multi_agent.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import ConfigError
from core.plugins.registry import BackendSpec

__all__ = ["check_policy_tokenizers", "policy_backend_config", "setting_keys"]


def setting_keys(settings: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys ``settings`` sets: ``{"lora": {"rank": 8}}`` -> ``["lora.rank"]`` (a list
    or any other non-mapping value is one setting)."""
    keys: list[str] = []
    for key, value in settings.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            keys.extend(setting_keys(value, f"{dotted}."))
        else:
            keys.append(dotted)
    return keys


def policy_backend_config(
    cfg: DictConfig,
    name: str,
    settings: Mapping[str, Any] | None,
    spec: BackendSpec,
    algorithm: Mapping[str, Any] | None = None,
) -> DictConfig:
    """The composed config policy ``name``'s backend is built from (``spec.factory`` takes it).

    ``cfg`` itself when the policy sets nothing (it trains the run's ``backend`` as it always
    has); else a copy whose ``backend`` is the run's with ``settings`` merged over it and whose
    ``algorithm`` has the policy's own ``algorithm`` settings in place of the run's (each whole:
    a policy's ``loss_config`` replaces the run's), so a backend that checks ``algorithm`` at
    start-up (a loss or temperature its service cannot train) checks the policy's.

    Raises:
        ConfigError: a key the backend does not let a policy set (naming the policy, the key
            and the keys it takes), or a combination it cannot honour (``spec.check_policy``).
    """
    plain = OmegaConf.to_container(settings, resolve=True) if OmegaConf.is_config(settings) else settings
    if not plain and not algorithm:
        return cfg
    plain = plain or {}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"policies.{name}.backend must be a mapping of backend settings, got {plain!r}")
    plain = {str(k): v for k, v in plain.items()}
    keys = setting_keys(plain)
    allowed = tuple(spec.policy_settings)
    unknown = [k for k in keys if k not in allowed]
    if unknown:
        takes = f"it takes {list(allowed)}" if allowed else "it takes none: every policy trains the run's backend settings"
        raise ConfigError(
            f"policies.{name}.backend.{unknown[0]}: backend {spec.name!r} cannot set {unknown[0]!r} per "
            f"policy; {takes}. Set it for every policy as backend.{unknown[0]}, or drop it (docs/multi_agent.md)"
        )
    try:
        merged = OmegaConf.merge(cfg, {"backend": plain})
    except OmegaConfBaseException as exc:  # a value of the wrong type for the backend's schema
        key = str(getattr(exc, "full_key", "") or "").removeprefix("backend.")
        where = f"policies.{name}.backend" + (f".{key}" if key else "")
        raise ConfigError(f"{where}: {str(exc).splitlines()[0]} (docs/multi_agent.md)") from None
    assert isinstance(merged, DictConfig)
    for key, value in (algorithm or {}).items():
        merged.algorithm[key] = value
    if spec.check_policy is not None and keys:
        try:
            spec.check_policy(merged.backend, keys)
        except (ConfigError, ValueError) as exc:
            raise ConfigError(f"policies.{name}.backend: {exc} (docs/multi_agent.md)") from None
    return merged


def _tokens(backend: Any) -> tuple[Any, Any]:
    tok = backend.get_tokenizer()
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else None
    return vocab, getattr(tok, "chat_template", None)


def check_policy_tokenizers(backends: Mapping[str, Any]) -> None:
    """Refuse policies whose models read other tokens than the first (default) policy's: the
    gateway renders and tokenizes every turn with that one's tokenizer, so another vocabulary
    or chat template would feed a policy ids that mean something else to it.

    Raises:
        ConfigError: naming the policy whose tokenizer differs, and its model.
    """
    names = list(backends)
    if len(names) < 2:
        return
    first = _tokens(backends[names[0]])
    for name in names[1:]:
        if _tokens(backends[name]) != first:
            raise ConfigError(
                f"policies.{name}: its model {backends[name].model_id()!r} has another tokenizer or chat "
                f"template than policy {names[0]!r} (model {backends[names[0]].model_id()!r}); the gateway "
                "renders every policy's turns with one tokenizer, so give each policy a model of the same "
                "family and vocabulary (docs/multi_agent.md)"
            )

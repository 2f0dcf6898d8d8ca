"""The loss vocabulary every backend and core's loop share.

- ``parse_loss_spec`` / ``LossSpec``: one parser decides what a valid
  ``algorithm.loss`` + ``algorithm.loss_config`` is, the same for every backend
  (keys, clip ranges, the entropy sign), so a setting is refused before any rollout.
- ``CLIP_DEFAULTS``, ``CLIPPED_LOSSES``, ``SAMPLER_LOGPROB_LOSSES``: each loss's
  clip range and which losses read the sampler's logprobs.
- ``loss_inputs`` / ``masked_advantages``: a ``core.types.Datum`` as named, typed,
  shaped arrays, for the keys a loss needs (Tinker's RL losses take no ``weights``;
  SageMaker's losses all require them), and advantages times the loss mask, for
  losses without a ``weights`` input.
- ``remote_loss`` / ``check_algorithm``: core's ``loss_config`` as a remote service
  (Tinker, SageMaker) takes it: ``clip_low``/``clip_high`` (PPO epsilons) become the
  ratio bounds both SDKs call ``clip_low_threshold``/``clip_high_threshold``; a
  training temperature the service cannot apply, and settings it has not, are
  refused (``ConfigError``) instead of dropped.

Nothing here imports an SDK, torch or boto3.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.config_nodes import cfg_get
from core.errors import ConfigError
from core.interfaces import LOSS_NAMES
from core.types import Datum

LOSS_INPUT_DTYPES: dict[str, str] = {
    "target_tokens": "int64",
    "weights": "float32",
    "logprobs": "float32",
    "advantages": "float32",
}
"""Wire dtype of every per-token loss input a ``Datum`` carries."""


@dataclass(frozen=True)
class LossInput:
    """One per-token loss input: flat data, its dtype name and its shape."""

    data: list[int] | list[float]
    """Values, one per position of ``model_input``."""
    dtype: str
    """``int64`` or ``float32``."""
    shape: list[int]
    """``[len(data)]``: every loss input is one-dimensional."""


def check_loss_fn(loss_fn: str, *, backend: str) -> str:
    """Return ``loss_fn`` or raise ``ConfigError`` naming the losses ``backend`` supports."""
    if loss_fn not in LOSS_NAMES:
        raise ConfigError(
            f"backend {backend!r} has no loss {loss_fn!r}; use one of {', '.join(LOSS_NAMES)} "
            "(algorithm.loss)"
        )
    return loss_fn


def masked_advantages(datum: Datum) -> list[float]:
    """Advantages with the loss mask applied (0.0 where ``weights`` is 0).

    ``Datum`` already carries 0.0 advantages outside generated tokens, but a
    caller may set a fractional weight; folding it in keeps the mask exact for
    losses that take no ``weights`` input.
    """
    return [a * w for a, w in zip(datum.advantages, datum.weights, strict=True)]


def loss_inputs(
    datum: Datum,
    keys: Iterable[str],
    *,
    overrides: Mapping[str, list[float]] | None = None,
) -> dict[str, LossInput]:
    """The loss inputs ``keys`` of ``datum`` as typed, shaped arrays.

    Args:
        datum: The training example (already shifted: targets are ``token_ids[1:]``).
        keys: Which inputs to produce, among ``LOSS_INPUT_DTYPES``.
        overrides: Replacement values for some keys (e.g. masked advantages).
    """
    overrides = overrides or {}
    out: dict[str, LossInput] = {}
    n = len(datum.model_input)
    for key in keys:
        if key not in LOSS_INPUT_DTYPES:
            raise ValueError(f"unknown loss input {key!r}; known: {sorted(LOSS_INPUT_DTYPES)}")
        raw = overrides.get(key, getattr(datum, key))
        dtype = LOSS_INPUT_DTYPES[key]
        data: list[int] | list[float] = (
            [int(v) for v in raw] if dtype == "int64" else [float(v) for v in raw]
        )
        if len(data) != n:
            raise ValueError(f"loss input {key!r} has {len(data)} values for {n} input tokens")
        out[key] = LossInput(data=data, dtype=dtype, shape=[n])
    return out


CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
"""The ``loss_fn_config`` keys both SDKs take for ``ppo`` and ``cispo``."""

CLIPPED_LOSSES = ("ppo", "cispo")
"""Losses that clip the ratio (the only ones that get a ``loss_fn_config``)."""

SAMPLER_LOGPROB_LOSSES = ("importance_sampling", "ppo", "cispo")
"""Losses whose ratio compares trainer logprobs with the sampler's."""

CLIP_DEFAULTS: dict[str, dict[str, float]] = {
    "ppo": {"clip_low": 0.2, "clip_high": 0.2},
    "cispo": {"clip_low": 1.0, "clip_high": 0.2},
}
"""Core's clip epsilons when ``loss_config`` omits them, the local backend's values.

CISPO clips only the upper side by default (``clip_low`` 1.0: lower ratio
bound 0, as in MiniMax-M1); a ``clip_low`` the config gives is honoured, as
the local backend and slime (``--eps-clip``) honour it. Both bounds are always
sent, so a run never depends on a service's own default (Tinker's CISPO
default upper bound is 4.0, not core's 1.2)."""

NEUTRAL_SETTINGS: dict[str, float] = {
    "temperature": 1.0,
    "top_k": -1.0,
    "top_p": 1.0,
    "entropy_coef": 0.0,
    "tis_cap": 0.0,
    "dual_clip": 0.0,
}
"""Non-clip ``loss_config`` keys core knows, at the value that changes nothing
(``tis_cap`` 0: importance weights are not truncated; ``dual_clip`` 0: a
negative-advantage ``ppo`` token is not bounded below)."""

DUAL_CLIP_DEFAULT = 3.0
"""``ppo``'s dual-clip constant when ``loss_config`` omits it (verl's ``clip_ratio_c``;
Ye et al. 2020): a token with a negative advantage whose ratio exceeds it gets no
gradient instead of a weight ``r`` that grows without bound. Applied by the local
backend; Tinker's and SageMaker's ``ppo`` have no such setting."""


LOSS_CONFIG_KEYS: tuple[str, ...] = ("clip_low", "clip_high", *CLIP_KEYS, *NEUTRAL_SETTINGS)
"""Every ``algorithm.loss_config`` key core knows."""


@dataclass(frozen=True)
class LossSpec:
    """``algorithm.loss_config`` checked once, the same way for every backend.

    Each backend then maps these values to its own settings or refuses the ones it
    cannot apply; what counts as a valid config is decided here, not per backend.
    """

    loss: str
    """The loss (``algorithm.loss``)."""
    clip_low: float
    """Distance of the lower ratio bound from 1 (``CLIP_DEFAULTS`` when not given)."""
    clip_high: float
    """Distance of the upper ratio bound from 1."""
    temperature: float
    """Temperature the trainer's logprobs must be taken at."""
    top_k: float
    top_p: float
    entropy_coef: float
    """Entropy bonus (>= 0)."""
    tis_cap: float = 0.0
    """Truncated importance weight: each token's ``pi_trainer / pi_sampler`` weight in
    the gradient is capped here (0: no cap; else >= 1). ``algorithm.tis_cap``."""
    dual_clip: float = 0.0
    """``ppo`` only: a negative-advantage token whose ratio is above this gets no
    gradient (0: off; else > 1). ``DUAL_CLIP_DEFAULT`` when not given."""

    def changes(self, key: str) -> bool:
        """True when ``key`` (a ``NEUTRAL_SETTINGS`` name) is away from its neutral value."""
        return float(getattr(self, key)) != NEUTRAL_SETTINGS[key]


def parse_loss_spec(
    loss_fn: str,
    loss_config: Mapping[str, Any] | None,
    *,
    backend: str,
    hint: str,
    temperature: float | None = None,
) -> LossSpec:
    """Check ``loss_config`` for ``loss_fn`` and resolve its clip range.

    Args:
        loss_fn: ``algorithm.loss``.
        loss_config: ``algorithm.loss_config`` (core's loop adds ``temperature``).
        backend: Backend name, for messages.
        hint: What to do instead, appended to the unknown-key message.
        temperature: ``algorithm.temperature`` for backends that sample and train at
            one temperature; a different ``loss_config.temperature`` is then refused.

    Raises:
        ConfigError: a value that is not a number, an unknown key, both forms of one
            clip bound, a bound out of range, or a negative entropy bonus.
    """
    given: dict[str, float] = {}
    for key, value in dict(loss_config or {}).items():
        try:
            given[str(key)] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"algorithm.loss_config.{key}={value!r} is not a number") from None
    unknown = sorted(set(given) - set(LOSS_CONFIG_KEYS))
    if unknown:
        raise ConfigError(
            f"backend {backend!r}: algorithm.loss_config keys {unknown} have no {backend} "
            f"equivalent; known keys: {sorted(LOSS_CONFIG_KEYS)}. {hint}"
        )
    if temperature is not None and given.get("temperature", temperature) != temperature:
        raise ConfigError(
            f"algorithm.loss_config.temperature={given['temperature']!r} differs from "
            f"algorithm.temperature={temperature!r}: {backend} samples and trains at one "
            "temperature; remove loss_config.temperature"
        )
    eps = dict(CLIP_DEFAULTS.get(loss_fn, CLIP_DEFAULTS["ppo"]))
    for side in ("low", "high"):
        eps_key, bound_key = f"clip_{side}", f"clip_{side}_threshold"
        if eps_key in given and bound_key in given:
            raise ConfigError(
                f"algorithm.loss_config sets both {eps_key} and {bound_key}; keep one "
                f"({eps_key} is the distance from ratio 1, {bound_key} the ratio bound itself)"
            )
        if eps_key in given:
            eps[eps_key] = given[eps_key]
        elif bound_key in given:
            bound = given[bound_key]
            eps[eps_key] = round(1.0 - bound if side == "low" else bound - 1.0, 12)
    if not 0.0 <= eps["clip_low"] <= 1.0 or eps["clip_high"] < 0.0:
        raise ConfigError(
            f"algorithm.loss_config clip_low={eps['clip_low']!r}, clip_high={eps['clip_high']!r}: "
            "clip_low must be in [0, 1] and clip_high >= 0 (distances from ratio 1)"
        )
    spec = LossSpec(
        loss=loss_fn,
        clip_low=eps["clip_low"],
        clip_high=eps["clip_high"],
        temperature=given.get("temperature", 1.0 if temperature is None else temperature),
        top_k=given.get("top_k", NEUTRAL_SETTINGS["top_k"]),
        top_p=given.get("top_p", NEUTRAL_SETTINGS["top_p"]),
        entropy_coef=given.get("entropy_coef", NEUTRAL_SETTINGS["entropy_coef"]),
        tis_cap=given.get("tis_cap", NEUTRAL_SETTINGS["tis_cap"]),
        dual_clip=given.get("dual_clip", DUAL_CLIP_DEFAULT if loss_fn == "ppo" else 0.0),
    )
    if "dual_clip" in given and loss_fn != "ppo" and spec.dual_clip:
        raise ConfigError(
            f"algorithm.loss_config.dual_clip bounds ppo's unclipped branch; loss {loss_fn!r} has "
            "none (cispo's weight is clipped, importance_sampling's is truncated by tis_cap)"
        )
    if not (spec.dual_clip == 0.0 or 1.0 < spec.dual_clip < float("inf")):
        raise ConfigError(
            f"algorithm.loss_config.dual_clip={spec.dual_clip!r} must be 0 (off) or a finite number > 1"
        )
    if not (spec.tis_cap == 0.0 or 1.0 <= spec.tis_cap < float("inf")):
        raise ConfigError(
            f"algorithm.tis_cap={spec.tis_cap!r} must be 0 (off) or a finite number >= 1 (a cap "
            "below 1 would also shrink on-policy tokens, whose weight is 1)"
        )
    if spec.tis_cap and loss_fn not in SAMPLER_LOGPROB_LOSSES:
        raise ConfigError(
            f"algorithm.tis_cap truncates pi_trainer / pi_sampler, but loss {loss_fn!r} has no such "
            "ratio; drop algorithm.tis_cap or use importance_sampling, ppo or cispo"
        )
    if spec.entropy_coef < 0:
        raise ConfigError(
            f"algorithm.loss_config.entropy_coef={spec.entropy_coef!r} must be >= 0 (a bonus on entropy)"
        )
    return spec


@dataclass(frozen=True)
class RemoteLoss:
    """Core's ``loss_config`` as a remote service takes it."""

    config: dict[str, float]
    """``loss_fn_config``: both ratio bounds for ``ppo``/``cispo``, else empty."""
    temperature: float = 1.0
    """Softmax temperature the trainer must apply to its logprobs (1.0: none)."""


def remote_loss(
    loss_fn: str,
    loss_config: Mapping[str, float] | None,
    *,
    backend: str,
    forwards_temperature: bool,
    docs: str,
) -> RemoteLoss:
    """Translate core's loss settings for a remote service, refusing what it would drop.

    Core (``algorithm.loss_config``) speaks PPO epsilons: the ratio is clipped
    to ``[1 - clip_low, 1 + clip_high]`` (defaults in ``CLIP_DEFAULTS``).
    Tinker and SageMaker take the bounds themselves as ``clip_low_threshold``
    / ``clip_high_threshold``; keys already in that form are accepted and
    range-checked like the epsilons (``parse_loss_spec``).

    Core's loop also puts ``temperature`` (``algorithm.temperature``) here.
    With a loss that divides trainer by sampler probabilities, the trainer
    must apply the sampler's temperature, or the ratio compares tempered
    sampler logprobs with untempered trainer logprobs and learning stalls.
    A service that cannot (``forwards_temperature=False``) gets a
    ``ConfigError`` instead of a silently wrong ratio; so do ``top_k``,
    ``top_p`` and ``entropy_coef`` away from their neutral values (neither
    service applies them in training) and keys core does not know.

    Raises:
        ConfigError: naming the key, its value and what to do, before anything is sent.
    """
    spec = parse_loss_spec(
        loss_fn, loss_config, backend=backend, hint=f"See {docs}. Nothing was sent to the service."
    )
    uses_sampler = loss_fn in SAMPLER_LOGPROB_LOSSES
    temperature = spec.temperature
    if uses_sampler and temperature != 1.0:
        if not forwards_temperature:
            raise ConfigError(
                f"backend {backend!r} cannot train loss {loss_fn!r} at algorithm.temperature="
                f"{temperature!r}: its forward_backward takes no temperature, so the ratio would "
                "compare tempered sampler logprobs with untempered trainer logprobs. Set "
                "algorithm.temperature=1.0 (or use a backend that applies it: local, verl, slime, "
                f"sagemaker). See {docs}. Nothing was sent to the service."
            )
        if not temperature > 0:
            raise ConfigError(
                f"algorithm.temperature={temperature!r}: loss {loss_fn!r} needs sampled logprobs, "
                "so the training temperature must be > 0"
            )
    if spec.changes("tis_cap"):
        raise ConfigError(
            f"backend {backend!r} cannot truncate importance weights (algorithm.tis_cap="
            f"{spec.tis_cap!r}): its {loss_fn} loss takes only the sampler logprobs, with no cap "
            f"setting. Drop algorithm.tis_cap (the ratio still uses the sampler's logprobs, so "
            f"off-policy tokens are corrected; ppo/cispo clip it) or use the local backend. "
            f"See {docs}. Nothing was sent to the service."
        )
    if float(dict(loss_config or {}).get("dual_clip", 0.0) or 0.0):
        raise ConfigError(
            f"backend {backend!r} cannot dual-clip (algorithm.loss_config.dual_clip="
            f"{spec.dual_clip!r}): its ppo loss has no such setting; remove it or use the local "
            f"backend. See {docs}. Nothing was sent to the service."
        )
    for key in ("top_k", "top_p", "entropy_coef"):
        if spec.changes(key) and (uses_sampler or key == "entropy_coef"):
            raise ConfigError(
                f"backend {backend!r} cannot apply algorithm.loss_config.{key}={getattr(spec, key)!r} in "
                f"training (the service has no such setting); remove it or use the local backend. "
                f"See {docs}. Nothing was sent to the service."
            )
    if loss_fn not in CLIPPED_LOSSES:
        return RemoteLoss(config={}, temperature=temperature if uses_sampler else 1.0)
    config = {
        "clip_low_threshold": round(1.0 - spec.clip_low, 12),
        "clip_high_threshold": round(1.0 + spec.clip_high, 12),
    }
    return RemoteLoss(config=config, temperature=temperature)


def check_algorithm(cfg: Any, *, backend: str, forwards_temperature: bool, docs: str) -> RemoteLoss:
    """Check ``cfg.algorithm`` as core's loop will send it, before any remote call.

    Builds the ``loss_config`` the loop passes to ``forward_backward``
    (``algorithm.loss_config`` plus ``temperature``) and runs ``remote_loss``
    on it, so a config the service cannot honour fails at start-up, not after
    the first batch of rollouts. A config without ``algorithm`` passes.
    """
    algo = cfg_get(cfg, "algorithm", None)
    if algo is None:
        return RemoteLoss(config={})
    loss_fn = check_loss_fn(str(cfg_get(algo, "loss", "ppo")), backend=backend)
    raw = cfg_get(algo, "loss_config", None) or {}
    loss_config = {str(k): float(v) for k, v in dict(raw).items()}
    loss_config.setdefault("temperature", float(cfg_get(algo, "temperature", 1.0)))
    if float(cfg_get(algo, "tis_cap", 0.0) or 0.0):
        loss_config["tis_cap"] = float(cfg_get(algo, "tis_cap"))
    return remote_loss(
        loss_fn, loss_config, backend=backend, forwards_temperature=forwards_temperature, docs=docs
    )

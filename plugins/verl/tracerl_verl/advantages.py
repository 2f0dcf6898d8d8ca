"""tracerl's advantage estimators for verl: one rollout counts once, a lone rollout gets 0.

Defines ``ESTIMATORS`` (``algorithm.name`` -> the name registered with verl),
``STD_KINDS``, ``EPS``, ``register`` (verl's ``register_adv_est`` for each of ours),
``rollout_rows`` and ``compute_advantage_per_rollout``, and ``install``.

Why: verl's v1 trainer reduces a multi-row session (``{uid}_{session_id}_*``
keys) to its final row only for stock ``grpo``; every other estimator groups
all rows by ``uid``, so a rollout that forked counts once per row in its own
baseline. And verl's group estimators treat a group of one as "mean 0, std 1"
(GRPO, GPG) or "baseline 0" (RLOO), so a rollout whose siblings all failed
(the agent loop drops failed rollouts) trains on its raw reward. tracerl's
rule (``core.testing.parity``) is different: a rollout counts once in its
group, and a group with fewer than two scored rollouts gives advantage 0.

So each allowed ``algorithm.name`` maps to ``tracerl_<name>``, registered in
verl's estimator registry: it computes verl's estimator (ours for GRPO, for
the std switch) on groups of two or more rollouts and 0 elsewhere.
``install`` wraps the one function the v1 trainer calls for advantages
(``trainer_base.compute_advantage_for_multi_trajectories``) so that our
estimators see one row per rollout (the session's final row, as verl does for
``grpo``) and their per-rollout value is broadcast to every row of the
rollout on its generated tokens. Any other estimator name is passed to verl
unchanged. Both run in every verl process through ``tracerl_verl.verl_ext``.

``algorithm.std`` (core's switch) picks GRPO's spread: ``population`` (core's
default: squared deviations / n) or ``sample`` (/ (n - 1), ``torch.std`` as in
verl's stock GRPO). The epsilon added to it is core's 1e-4 (verl's stock GRPO
adds 1e-6), so one config gives the same advantages on every backend. Both
reach verl as ``algorithm.tracerl_std`` and ``algorithm.tracerl_eps``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and verl load on use: translate.py imports the names above cheaply
    import numpy as np
    import torch

ESTIMATORS = {
    "grpo": "tracerl_grpo",
    "rloo": "tracerl_rloo",
    "grpo_passk": "tracerl_grpo_passk",
    "gpg": "tracerl_gpg",
}
"""``algorithm.name`` -> the estimator registered with verl. Left out on purpose:
``reinforce_plus_plus`` (batch-whitened per-token returns, no per-rollout value to
count once) and ``opo`` (its baseline weighs each rollout by its response length,
which a multi-row rollout does not have as one row's length)."""

STD_KINDS = ("population", "sample")
"""``algorithm.std`` values: divide squared deviations by n, or by n - 1 (verl's stock GRPO)."""

EPS = 1e-4
"""Added to the group std, as in core (``core.algo.compute_group_advantages``)."""

SUPPORTED_VERL = "0.9.1"

_ORIGINAL: Callable[..., Any] | None = None


def _get(config: Any, key: str, default: Any) -> Any:
    """``config[key]`` for verl's DictConfig or AlgoConfig (both have ``get``), else default."""
    if config is None:
        return default
    value = config.get(key, default)
    return default if value is None else value


def _grpo(scores: torch.Tensor, index: np.ndarray, config: Any) -> torch.Tensor:
    """GRPO per rollout: ``(r - mean) / (std + eps)`` per group; equal rewards give 0."""
    std_kind = str(_get(config, "tracerl_std", "population"))
    if std_kind not in STD_KINDS:
        raise ValueError(f"algorithm.tracerl_std={std_kind!r}; use one of {STD_KINDS}")
    eps = float(_get(config, "tracerl_eps", EPS))
    import torch

    normalize = bool(_get(config, "norm_adv_by_std_in_grpo", True))
    out = torch.zeros_like(scores)
    groups: dict[Any, list[int]] = {}
    for i, uid in enumerate(index):
        groups.setdefault(uid, []).append(i)
    for members in groups.values():
        r = scores[members].double()
        if float(r.max() - r.min()) <= 1e-12:
            continue
        centred = r - r.mean()
        if normalize:
            centred = centred / (r.std(unbiased=std_kind == "sample") + eps)
        out[members] = centred.to(out.dtype)
    return out


def _make_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """tracerl's version of verl estimator ``name`` (see the module docstring)."""

    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np
        import torch

        index = np.asarray(index, dtype=object)
        sizes = Counter(index.tolist())
        keep = np.array([sizes[uid] >= 2 for uid in index.tolist()], dtype=bool)
        adv = torch.zeros_like(token_level_rewards)
        if keep.any():
            rows = torch.from_numpy(keep)
            if name == "grpo":
                scores = token_level_rewards[rows].sum(dim=-1)
                part = _grpo(scores, index[keep], config).unsqueeze(-1) * response_mask[rows]
            else:
                from verl.trainer.ppo import core_algos

                part, _ = core_algos.get_adv_estimator_fn(name)(
                    token_level_rewards=token_level_rewards[rows],
                    response_mask=response_mask[rows],
                    index=index[keep],
                    config=config,
                )
            adv[rows] = part.to(adv.dtype)
        return adv, adv

    estimator.__name__ = f"compute_tracerl_{name}_advantage"
    estimator.__doc__ = (
        f"verl's {name} on groups of two or more rollouts, 0 for smaller groups "
        "(tracerl_verl.advantages)."
    )
    return estimator


def rollout_rows(batch_keys: Sequence[str]) -> tuple[list[int], list[int]]:
    """One row per rollout, and each row's rollout.

    verl keys rows ``{uid}_{session_id}_{index}``; a session is one rollout, and
    its final row (highest index) stands for it, as in verl's own GRPO path.

    Returns:
        ``(final, owner)``: the batch position of each rollout's final row, and for
        every row the position of its rollout in ``final``.
    """
    last: dict[str, tuple[int, int]] = {}
    sessions = []
    for pos, key in enumerate(batch_keys):
        parts = str(key).rsplit("_", 2)
        if len(parts) != 3:
            raise ValueError(f"verl row key {key!r} is not '{{uid}}_{{session_id}}_{{index}}'")
        session, index = f"{parts[0]}_{parts[1]}", int(parts[2])
        sessions.append(session)
        if session not in last or last[session][0] < index:
            last[session] = (index, pos)
    order = {s: k for k, s in enumerate(last)}
    return [pos for _, pos in last.values()], [order[s] for s in sessions]


def compute_advantage_per_rollout(
    data: Any,
    batch_keys: Sequence[str],
    adv_estimator: Any,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> Any:
    """Drop-in for verl's ``compute_advantage_for_multi_trajectories`` (same arguments).

    For a tracerl estimator: verl's ``compute_advantage`` on each rollout's final
    row (our registered estimator through verl's registry), then the rollout's
    advantage on every generated token of each of its rows. Anything else goes
    to verl's original function.
    """
    name = getattr(adv_estimator, "value", adv_estimator)
    if str(name) not in ESTIMATORS.values():
        if _ORIGINAL is None:
            raise RuntimeError(
                "tracerl_verl.advantages.install() was not called; import tracerl_verl.verl_ext"
            )
        return _ORIGINAL(
            data,
            batch_keys=batch_keys,
            adv_estimator=adv_estimator,
            gamma=gamma,
            lam=lam,
            num_repeat=num_repeat,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
    import torch
    from verl.trainer.ppo.ray_trainer import compute_advantage

    final, owner = rollout_rows(batch_keys)
    reduced = compute_advantage(
        data.select_idxs(final),
        adv_estimator=str(name),
        gamma=gamma,
        lam=lam,
        num_repeat=num_repeat,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=config,
    )
    mask = reduced.batch["response_mask"]
    first = mask.argmax(dim=1)
    per_rollout = reduced.batch["advantages"][torch.arange(len(final)), first]
    per_rollout = per_rollout * (mask.sum(dim=1) > 0)
    scores = per_rollout[owner].unsqueeze(-1) * data.batch["response_mask"]
    data.batch["advantages"] = scores
    data.batch["returns"] = scores
    return data


def register() -> None:
    """Add ``tracerl_<name>`` for each of ``ESTIMATORS`` to verl's registry (idempotent)."""
    from verl.trainer.ppo import core_algos

    for base, ours in ESTIMATORS.items():
        if ours not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(ours)(_make_estimator(base))


def install() -> None:
    """Register our estimators and route the v1 trainer's advantage call through ours.

    Raises:
        RuntimeError: verl is not 0.9.1 (the wrapped function may have moved or changed).
    """
    global _ORIGINAL
    import verl

    if verl.__version__ != SUPPORTED_VERL:
        raise RuntimeError(
            f"tracerl's advantage estimators are checked against verl {SUPPORTED_VERL}, found "
            f"{verl.__version__}; re-check trainer_base.compute_advantage_for_multi_trajectories "
            "and tracerl_verl/advantages.py before bumping"
        )
    from verl.trainer.ppo.v1 import trainer_base

    register()
    current = trainer_base.compute_advantage_for_multi_trajectories
    if current is not compute_advantage_per_rollout:
        _ORIGINAL = current
        trainer_base.compute_advantage_for_multi_trajectories = compute_advantage_per_rollout

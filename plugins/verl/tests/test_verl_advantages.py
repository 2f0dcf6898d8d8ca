"""tracerl's advantage estimators inside verl's real advantage code (no fakes).

Each test builds the batch verl's v1 trainer builds from agent-loop outputs
(``verl_fixtures.verl_batch``) and calls what its ``_compute_advantage`` calls:
``trainer_base.compute_advantage_for_multi_trajectories``, which
``tracerl_verl.verl_ext`` routes to ``compute_advantage_per_rollout`` for our
estimators, then verl's ``compute_advantage`` and its estimator registry.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from tracerl_verl.advantages import EPS, ESTIMATORS
from tracerl_verl.rows import VerlRow, to_agent_loop_outputs
from verl_fixtures import compose_tracerl, run_verl_advantage, verl_batch, verl_main_config


@pytest.fixture(scope="module", autouse=True)
def _verl_ext() -> None:
    """Import the module verl imports in every process (registers and routes our estimators)."""
    import tracerl_verl.verl_ext  # noqa: F401


def _out(reward: float, mask: list[int]) -> Any:
    """One agent-loop output (the plugin's ``to_agent_loop_outputs``) with this mask."""
    row = VerlRow(
        prompt_ids=[1, 2],
        response_ids=list(range(10, 10 + len(mask))),
        response_mask=mask,
        response_logprobs=[-0.1 * m for m in mask],
    )
    (out,) = to_agent_loop_outputs(
        [row], reward=reward, min_global_steps=0, max_global_steps=0, with_logprobs=True
    )
    return out


def _algo(estimator: str, std: str = "population", normalize: bool = True) -> Any:
    return OmegaConf.create(
        {
            "adv_estimator": estimator,
            "gamma": 1.0,
            "lam": 1.0,
            "norm_adv_by_std_in_grpo": normalize,
            "tracerl_std": std,
            "tracerl_eps": EPS,
        }
    )


def _per_row(data: Any) -> list[float]:
    """Each row's advantage on its first trained token (the value on all of them)."""
    adv, mask = data.batch["advantages"], data.batch["response_mask"]
    values = []
    for k in range(len(adv)):
        trained = adv[k][mask[k].bool()]
        assert torch.allclose(trained, trained[0].expand_as(trained)), "not one value per row"
        assert torch.all(adv[k][~mask[k].bool()] == 0), "advantage on an untrained token"
        values.append(float(trained[0]))
    return values


def _lone_and_normal() -> list[tuple[str, list[Any]]]:
    return [
        ("lone", [_out(1.0, [1, 1, 0, 1])]),
        ("g", [_out(1.0, [1, 1])]),
        ("g", [_out(0.0, [1, 0, 1])]),
        ("g", [_out(0.5, [1])]),
    ]


def test_stock_verl_grpo_pushes_a_lone_survivor_by_its_raw_reward() -> None:
    """The behaviour being fixed: verl's GRPO gives a group of one mean 0 and std 1."""
    data, keys = verl_batch(_lone_and_normal())
    out = run_verl_advantage(data, keys, _algo("grpo"))
    assert _per_row(out)[0] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("std", ["population", "sample"])
def test_lone_survivor_gets_zero_and_a_normal_group_its_grpo_advantage(std: str) -> None:
    data, keys = verl_batch(_lone_and_normal())
    got = _per_row(run_verl_advantage(data, keys, _algo("tracerl_grpo", std)))
    assert got[0] == 0.0
    rewards = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    spread = rewards.std(unbiased=std == "sample")
    expected = (rewards - rewards.mean()) / (spread + EPS)
    assert got[1:] == pytest.approx(expected.tolist(), abs=1e-6)


def test_sample_std_is_verls_grpo_with_cores_epsilon() -> None:
    """``algorithm.std=sample`` computes what stock verl GRPO does (epsilon aside)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    groups = _lone_and_normal()[1:]
    data, keys = verl_batch(groups)
    ours = _per_row(run_verl_advantage(data, keys, _algo("tracerl_grpo", "sample")))
    stock, _ = compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        epsilon=EPS,
    )
    assert ours == pytest.approx([float(stock[k][0]) for k in range(3)], abs=1e-6)


def test_the_std_switch_survives_verls_own_config_path() -> None:
    """``algorithm.std`` as main_ppo delivers it: our translation, verl's Hydra config,
    Ray's pickling and ``OmegaConf.resolve``, then the trainer's ``config.algorithm``.

    verl 0.9.1 hands the estimator that ``DictConfig``, so ``tracerl_std`` /
    ``tracerl_eps`` arrive. Its ``AlgoConfig`` dataclass would refuse them (it has
    no extra-keys field), so if a verl release starts converting the node, this
    fails loudly instead of ``sample`` silently becoming ``population``.
    """
    from omegaconf import DictConfig
    from tracerl_verl.translate import LaunchPaths, verl_overrides
    from verl.trainer.config import AlgoConfig
    from verl.utils.config import omega_conf_to_dataclass

    paths = LaunchPaths(
        run_dir="/r", model="/m", train_file="/t", val_file="/v", agent_loop_yaml="/a"
    )
    groups = _lone_and_normal()[1:]  # one group, rewards 1.0, 0.0, 0.5
    got = {}
    for std in ("population", "sample"):
        cfg = compose_tracerl(["backend=verl", f"algorithm.std={std}"])
        algo = verl_main_config(verl_overrides(cfg, paths)).algorithm
        assert isinstance(algo, DictConfig) and algo.tracerl_std == std
        assert algo.adv_estimator == "tracerl_grpo" and float(algo.tracerl_eps) == EPS
        data, keys = verl_batch(groups)
        got[std] = _per_row(run_verl_advantage(data, keys, algo))
    rewards = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    for std, values in got.items():
        spread = rewards.std(unbiased=std == "sample")
        assert values == pytest.approx(
            ((rewards - rewards.mean()) / (spread + EPS)).tolist(), abs=1e-6
        )
    # sample std is larger (n - 1): the same rewards give smaller advantages
    assert abs(got["sample"][0]) < abs(got["population"][0]) - 0.1
    with pytest.raises(Exception, match="tracerl_std"):
        omega_conf_to_dataclass(algo, AlgoConfig)
    with pytest.raises(Exception, match="tracerl_std"):
        omega_conf_to_dataclass(algo)


def test_constant_group_and_unnormalised_grpo() -> None:
    sessions = [("c", [_out(1.0, [1])]), ("c", [_out(1.0, [1, 1])]), *_lone_and_normal()[1:]]
    data, keys = verl_batch(sessions)
    got = _per_row(run_verl_advantage(data, keys, _algo("tracerl_grpo", normalize=False)))
    assert got[:2] == [0.0, 0.0]
    assert got[2:] == pytest.approx([0.5, -0.5, 0.0], abs=1e-6)


def _forked(forked: bool) -> list[tuple[str, list[Any]]]:
    """A group of three rollouts, the first one in two rows when ``forked``; plus a lone one."""
    first = [_out(1.0, [1, 0, 0]), _out(1.0, [0, 1, 1, 1])] if forked else [_out(1.0, [0, 1, 1, 1])]
    return [
        ("g", first),
        ("g", [_out(0.0, [1, 1])]),
        ("g", [_out(0.25, [1, 1, 1])]),
        ("lone", [_out(1.0, [1])]),
    ]


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_allowed_estimator_counts_a_forked_rollout_once(name: str) -> None:
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    data, keys = verl_batch(_forked(True))
    forked = _per_row(run_verl_advantage(data, keys, _algo(ESTIMATORS[name])))
    plain_data, plain_keys = verl_batch(_forked(False))
    plain = _per_row(run_verl_advantage(plain_data, plain_keys, _algo(ESTIMATORS[name])))
    # both rows of the forked rollout carry the rollout's advantage ...
    assert forked[0] == pytest.approx(forked[1], abs=1e-6)
    # ... which is what the same rollout in one row gets: it counted once
    assert [forked[0], *forked[2:]] == pytest.approx(plain, abs=1e-6)
    # the lone rollout gets 0
    assert plain[-1] == 0.0
    # and on groups of two or more it is verl's own estimator, one row per rollout
    group = plain_data.select_idxs([0, 1, 2])
    stock, _ = get_adv_estimator_fn(name)(
        token_level_rewards=group.batch["token_level_rewards"],
        response_mask=group.batch["response_mask"],
        index=group.non_tensor_batch["uid"],
        config=_algo(name),
    )
    first = group.batch["response_mask"].argmax(dim=1)
    stock_values = [float(stock[k][first[k]]) for k in range(3)]
    if name == "grpo":  # ours uses core's epsilon and population std by default
        rewards = torch.tensor([1.0, 0.0, 0.25], dtype=torch.float64)
        stock_values = ((rewards - rewards.mean()) / (rewards.std(unbiased=False) + EPS)).tolist()
    assert plain[:3] == pytest.approx(stock_values, abs=1e-6)
    assert any(abs(v) > 1e-3 for v in plain[:3])


def test_rloo_without_the_reduction_counts_every_row() -> None:
    """Why the reduction matters: verl's RLOO on all rows puts the fork in its own baseline."""
    data, keys = verl_batch(_forked(True))
    raw = _per_row(run_verl_advantage(data, keys, _algo("rloo")))
    plain_data, plain_keys = verl_batch(_forked(False))
    ours = _per_row(run_verl_advantage(plain_data, plain_keys, _algo("tracerl_rloo")))
    assert raw[0] != pytest.approx(ours[0], abs=1e-3)


def test_other_estimators_pass_through_to_verl_unchanged() -> None:
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories as original

    assert trainer_base.compute_advantage_for_multi_trajectories is not original
    data, keys = verl_batch(_forked(True))
    via_ours = run_verl_advantage(data, keys, _algo("rloo")).batch["advantages"].clone()
    data, keys = verl_batch(_forked(True))
    direct = original(data, batch_keys=keys, adv_estimator="rloo", config=_algo("rloo"))
    assert torch.equal(via_ours, direct.batch["advantages"])

"""``core.algo.losses.remote_loss``: core's loss settings as Tinker and SageMaker take them.

The remote services clip with ratio bounds and cannot apply every setting
core's loop sends, so these tests pin the translation and every refusal
(what used to be dropped silently: the training temperature, entropy_coef,
unknown keys), and that the default clip range is the local backend's.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from core.algo.losses import CLIP_DEFAULTS, check_algorithm, remote_loss
from core.errors import ConfigError
from core.trainer.config import AlgorithmConfig


def _remote(loss_fn: str, config: dict[str, float] | None, *, forwards: bool = False) -> object:
    return remote_loss(loss_fn, config, backend="svc", forwards_temperature=forwards, docs="docs/x.md")


@pytest.mark.parametrize(
    ("loss_fn", "config", "expected"),
    [
        ("ppo", {"clip_low": 0.2, "clip_high": 0.28}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}),
        ("ppo", {}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        # CISPO: no lower clip unless asked for (core's documented default), upper bound 1.2
        ("cispo", {}, {"clip_low_threshold": 0.0, "clip_high_threshold": 1.2}),
        ("cispo", {"clip_high": 0.28}, {"clip_low_threshold": 0.0, "clip_high_threshold": 1.28}),
        ("cispo", {"clip_low": 0.2, "clip_high": 0.2}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        ("ppo", {"clip_low_threshold": 0.7, "clip_high": 0.3}, {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}),
        ("importance_sampling", {"clip_low": 0.2, "clip_high": 0.2}, {}),
        ("cross_entropy", {"clip_low": 0.2, "clip_high": 0.2}, {}),
    ],
)
def test_clip_bounds_are_always_explicit(
    loss_fn: str, config: dict[str, float], expected: dict[str, float]
) -> None:
    got = remote_loss(loss_fn, config, backend="svc", forwards_temperature=False, docs="d")
    assert got.config == pytest.approx(expected)
    assert set(got.config) == set(expected)


def test_defaults_agree_with_the_local_backend() -> None:
    """One CISPO/PPO default for every backend: the local backend's losses are the reference."""
    from tracerl_local import losses  # installed by `scripts/setup.sh test`, as every plugin

    for name, defaults in CLIP_DEFAULTS.items():
        settings = losses.parse_loss_config(name, {})
        assert (settings.clip_low, settings.clip_high) == (defaults["clip_low"], defaults["clip_high"])


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_training_temperature_is_refused_when_it_cannot_be_applied(loss_fn: str) -> None:
    with pytest.raises(ConfigError) as info:
        remote_loss(loss_fn, {"temperature": 0.7}, backend="svc", forwards_temperature=False, docs="d")
    message = str(info.value)
    assert "algorithm.temperature=0.7" in message and "algorithm.temperature=1.0" in message
    assert "Nothing was sent" in message


def test_training_temperature_is_returned_when_the_service_applies_it() -> None:
    got = remote_loss("ppo", {"temperature": 0.7}, backend="svc", forwards_temperature=True, docs="d")
    assert got.temperature == 0.7
    assert "temperature" not in got.config
    with pytest.raises(ConfigError, match="> 0"):
        remote_loss("ppo", {"temperature": 0.0}, backend="svc", forwards_temperature=True, docs="d")


def test_temperature_one_and_supervised_losses_pass() -> None:
    assert _remote("ppo", {"temperature": 1.0}).temperature == 1.0  # type: ignore[attr-defined]
    # cross_entropy never compares with the sampler: its temperature does not matter
    assert _remote("cross_entropy", {"temperature": 0.5}).temperature == 1.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"top_p": 0.9}, "top_p"),
        ({"top_k": 20}, "top_k"),
        ({"kl_coef": 0.1}, "kl_coef"),
        ({"clip_low": 1.5}, "clip_low"),
        ({"tis_cap": 2.0}, "cannot truncate importance weights"),
    ],
)
def test_settings_the_service_lacks_are_refused(config: dict[str, float], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        _remote("ppo", config)


def test_neutral_values_pass() -> None:
    got = _remote("ppo", {"entropy_coef": 0.0, "top_p": 1.0, "top_k": -1, "temperature": 1.0})
    assert got.config == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})  # type: ignore[attr-defined]


def test_check_algorithm_sees_what_the_loop_sends() -> None:
    """The loop adds algorithm.temperature to loss_config; the start-up check does the same."""
    cfg = OmegaConf.create({"algorithm": OmegaConf.structured(AlgorithmConfig)})
    assert check_algorithm(cfg, backend="svc", forwards_temperature=False, docs="d").config
    cfg.algorithm.temperature = 0.8
    with pytest.raises(ConfigError, match="algorithm.temperature=0.8"):
        check_algorithm(cfg, backend="svc", forwards_temperature=False, docs="d")
    assert check_algorithm(cfg, backend="svc", forwards_temperature=True, docs="d").temperature == 0.8
    cfg.algorithm.temperature = 1.0
    cfg.algorithm.tis_cap = 2.0
    with pytest.raises(ConfigError, match=r"algorithm.tis_cap=2.0\): its ppo loss"):
        check_algorithm(cfg, backend="svc", forwards_temperature=True, docs="d")
    cfg.algorithm.tis_cap = 0.0
    cfg.algorithm.temperature = 0.8
    cfg.algorithm.loss = "cross_entropy"
    assert check_algorithm(cfg, backend="svc", forwards_temperature=False, docs="d").config == {}
    cfg.algorithm.loss = "dpo"
    with pytest.raises(ConfigError, match="dpo"):
        check_algorithm(cfg, backend="svc", forwards_temperature=False, docs="d")


def test_one_parser_checks_loss_config_for_every_backend() -> None:
    """``parse_loss_spec`` is what local, Tinker, SageMaker, verl, slime and the loop all call."""
    from core.algo.losses import parse_loss_spec

    spec = parse_loss_spec("cispo", {"clip_high_threshold": 1.28}, backend="b", hint="h")
    assert (spec.clip_low, spec.clip_high) == pytest.approx((1.0, 0.28))  # one-sided by default
    assert not spec.changes("entropy_coef") and spec.temperature == 1.0
    with pytest.raises(ConfigError, match=r"\['kl_coef'\] have no b equivalent.*h$"):
        parse_loss_spec("ppo", {"kl_coef": 0.1}, backend="b", hint="h")
    with pytest.raises(ConfigError, match="kl_coef=.x. is not a number"):
        parse_loss_spec("ppo", {"kl_coef": "x"}, backend="b", hint="h")
    with pytest.raises(ConfigError, match="differs from algorithm.temperature=0.7"):
        parse_loss_spec("ppo", {"temperature": 1.0}, backend="b", hint="h", temperature=0.7)
    with pytest.raises(ConfigError, match="both clip_high and clip_high_threshold"):
        parse_loss_spec("ppo", {"clip_high": 0.2, "clip_high_threshold": 1.2}, backend="b", hint="h")
    with pytest.raises(ConfigError, match="entropy_coef=-1.0 must be >= 0"):
        parse_loss_spec("ppo", {"entropy_coef": -1}, backend="b", hint="h")

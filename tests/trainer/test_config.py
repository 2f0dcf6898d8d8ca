"""``load_train_config``: the composed config as the schema's dataclasses, checked once."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig

from core.errors import ConfigError
from core.gateway.config import GatewayConfig
from core.testing.build import compose_config
from core.trainer.config import AlgorithmConfig, TrainConfig, TrainerConfig, load_train_config
from core.trainer.fleet import SamplerConfig


def test_the_composed_config_becomes_the_schema_with_plugin_sections_as_composed() -> None:
    cfg = compose_config(["trainer.batch_size=3", "algorithm.loss=cispo"])
    typed = load_train_config(cfg)
    assert isinstance(typed, TrainConfig)
    assert isinstance(typed.trainer, TrainerConfig) and typed.trainer.batch_size == 3
    assert isinstance(typed.algorithm, AlgorithmConfig) and typed.algorithm.loss == "cispo"
    assert isinstance(typed.gateway, GatewayConfig) and isinstance(typed.sampler, SamplerConfig)
    # plugins own these sections: they stay the composed nodes
    assert isinstance(typed.backend, DictConfig) and isinstance(typed.runtime, DictConfig)
    assert typed.backend.name == cfg.backend.name and typed.runtime.name == cfg.runtime.name


def test_the_schema_default_is_the_one_the_loop_uses() -> None:
    """``keep_traces`` once defaulted to 0 in the loop and 100 in the schema."""
    assert load_train_config(compose_config()).trainer.keep_traces == TrainerConfig().keep_traces == 100


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.loss=nope", "algorithm.loss='nope'; use cross_entropy"),
        ("algorithm.token_mean_over=rows", "algorithm.token_mean_over='rows'; use batch or trained"),
        ("algorithm.std=bessel", "algorithm.std='bessel'; use population"),
        ("algorithm.tis_cap=0.5", "algorithm.tis_cap=0.5 must be 0 \\(off\\)"),
        ("trainer.group_size=0", "trainer.batch_size and trainer.group_size must be >= 1"),
        ("trainer.mode=later", "trainer.mode='later'; use sync or async"),
        ("trainer.max_abs_reward=0", "trainer.max_abs_reward must be a finite number > 0"),
        ("reward.timeout_s=-1", "reward.timeout_s must be a finite number >= 0"),
    ],
)
def test_a_bad_setting_is_refused_at_conversion(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_train_config(compose_config([override]))


QWEN3_NO_THINKING = "+gateway.chat_template_kwargs.enable_thinking=false"
"""The override docs/real_models.md and docs/samplers.md give for Qwen3's thinking switch."""


def test_the_documented_enable_thinking_override_composes_and_reaches_the_gateway() -> None:
    from pathlib import Path

    typed = load_train_config(compose_config([QWEN3_NO_THINKING]))
    assert typed.gateway.chat_template_kwargs == {"enable_thinking": False}
    # Without the '+' Hydra refuses it (the key is not in the empty dict): the docs give the form that works.
    with pytest.raises(Exception, match="enable_thinking"):
        compose_config([QWEN3_NO_THINKING.removeprefix("+")])
    docs = Path(__file__).resolve().parents[2] / "docs"
    for page in ("real_models.md", "samplers.md"):
        assert QWEN3_NO_THINKING in (docs / page).read_text(), page

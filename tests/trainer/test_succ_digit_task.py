"""The embedded default's task and recipe: what each kind of reply scores, and where the
entropy bonus of recipe/succ_digit-local.yaml applies."""

from __future__ import annotations

from typing import Any

from core.tasks.succ_digit import charwise_reward


def test_charwise_reward_credits_the_answer_and_stopping() -> None:
    assert charwise_reward("4", "4") == 1.0
    assert charwise_reward(" 4\n", "4") == 1.0  # stripped
    assert charwise_reward("4444", "4") == 0.25  # right digit, never stops
    assert charwise_reward("", "4") == 0.0
    assert charwise_reward("7", "4") == 0.0


def _composed(*overrides: str) -> Any:
    from core.plugins import load_plugins
    from core.testing.fakes import compose

    return compose(["run_dir=unused", *overrides], load_plugins())


def test_embedded_recipe_applies_to_succ_digit_on_the_local_backend_only() -> None:
    """The entropy bonus reaches the local backend; Tinker, which refuses a non-zero
    entropy_coef, keeps plain GRPO; the command line still overrides it."""
    local = _composed()
    assert local.algorithm.loss_config.entropy_coef == 0.01
    tinker = _composed("backend=tinker")
    assert "entropy_coef" not in tinker.algorithm.loss_config
    assert _composed("algorithm.loss_config.entropy_coef=0").algorithm.loss_config.entropy_coef == 0

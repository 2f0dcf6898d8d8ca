"""The embedded default's task and recipe: what each kind of reply scores, and where the
entropy bonus of recipe/succ_digit-local.yaml applies."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_long_tail_option_gives_each_rollout_its_own_seeded_heavy_tailed_delay(tmp_path: Any) -> None:
    """Issue #16: a seeded per-ROLLOUT delay, lognormal with p99/p50 about 10; the rows
    (the data) stay the same as without it, and eval rows get no delay."""
    import json

    from core.tasks import succ_digit
    from core.tasks.succ_digit import rollout_delay, write_dataset

    write_dataset(str(tmp_path / "plain.jsonl"), str(tmp_path / "e1.jsonl"), rows=500, seed=3)
    write_dataset(
        str(tmp_path / "tail.jsonl"), str(tmp_path / "e2.jsonl"), rows=500, seed=3, long_tail_p50_s=0.1
    )
    plain = [json.loads(line)["payload"] for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    tail = [json.loads(line)["payload"] for line in (tmp_path / "tail.jsonl").read_text().splitlines()]
    assert [{k: p[k] for k in ("n", "answer")} for p in tail] == plain  # same data, same order
    assert (tmp_path / "e1.jsonl").read_text() == (tmp_path / "e2.jsonl").read_text()  # eval: no delay
    assert rollout_delay(plain[0]) == 0.0

    def draw() -> list[list[float]]:  # 8 rollouts of each row, as the agent draws them
        succ_digit._rollouts_started.clear()
        return [[rollout_delay(p) for _ in range(8)] for p in tail]

    first, again = draw(), draw()
    assert first == again  # reproducible
    assert all(len(set(group)) == 8 for group in first)  # one group's rollouts differ
    delays = sorted(d for group in first for d in group)  # 4000 delays
    p50, p99 = delays[2000], delays[3960]
    assert 0.08 < p50 < 0.12 and 7 < p99 / p50 < 14
    with pytest.raises(ValueError, match="long_tail_ratio >= 1"):
        write_dataset(str(tmp_path / "x.jsonl"), str(tmp_path / "e3.jsonl"), long_tail_p50_s=0.1, long_tail_ratio=0.5)

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


def test_long_tail_option_adds_seeded_heavy_tailed_delays_and_keeps_the_rows(tmp_path: Any) -> None:
    import json

    from core.tasks.succ_digit import write_dataset

    write_dataset(str(tmp_path / "plain.jsonl"), str(tmp_path / "e1.jsonl"), rows=2000, seed=3)
    write_dataset(
        str(tmp_path / "tail.jsonl"), str(tmp_path / "e2.jsonl"), rows=2000, seed=3, long_tail_p50_s=0.1
    )
    plain = [json.loads(line)["payload"] for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    tail = [json.loads(line)["payload"] for line in (tmp_path / "tail.jsonl").read_text().splitlines()]
    assert [{k: p[k] for k in ("n", "answer")} for p in tail] == plain  # same data, same order
    delays = sorted(p["delay_s"] for p in tail)
    p50, p99 = delays[1000], delays[1980]
    assert 0.08 < p50 < 0.12 and 7 < p99 / p50 < 14
    assert (tmp_path / "e1.jsonl").read_text() == (tmp_path / "e2.jsonl").read_text()  # eval: no delay

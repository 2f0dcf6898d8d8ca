"""The two-role task's targets, its cap for one shared policy, and its data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.tasks.succ_digit import charwise_reward
from core.tasks.two_roles import (
    ROLES,
    SHARED_CAP,
    target,
    tokenizer_corpus,
    tokenizer_tokens,
    write_dataset,
)


def test_the_roles_answer_the_same_question_differently() -> None:
    assert [target("up", n) for n in (0, 3, 9)] == ["1", "4", "0"]
    assert [target("down", n) for n in (0, 3, 9)] == ["9", "2", "8"]
    assert all(target("up", n) != target("down", n) for n in range(10))


@pytest.mark.parametrize("reply", ["", "4", "2", "42", "24", "x", "4444", " 2 "])
def test_no_reply_scores_more_than_the_cap_across_both_roles(reply: str) -> None:
    """One shared policy gives both roles one reply distribution: the cap holds reply by reply."""
    mean = sum(charwise_reward(reply, target(role, 3)) for role in ROLES) / len(ROLES)
    assert mean <= SHARED_CAP


def test_the_data_draws_questions_from_the_first_digits(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl"), rows=50, digits=2)
    rows = [json.loads(line)["payload"] for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and {r["n"] for r in rows} == {0, 1}
    assert [json.loads(line)["payload"]["n"] for line in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 1]
    with pytest.raises(ValueError, match="digits must be 1..10"):
        write_dataset(str(tmp_path / "a"), str(tmp_path / "b"), digits=11)


def test_the_tokenizer_keeps_each_question_whole() -> None:
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(tokenizer_corpus(), vocab_size=60, whole_tokens=tokenizer_tokens())
    for n in range(10):
        assert len(tok.encode(f"After {n}?", add_special_tokens=False)) == 1
    assert all(len(tok.encode(str(d), add_special_tokens=False)) == 1 for d in range(10))

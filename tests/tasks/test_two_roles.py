"""The two-role relay: its targets, the turns and what passes between the roles, the cap for
one shared policy (exactly, over every way a conversation can go), and its data."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.tasks.succ_digit import charwise_reward
from core.tasks.two_roles import (
    ROLES,
    SHARED_CAP,
    Messages,
    next_question,
    play,
    target,
    tokenizer_corpus,
    tokenizer_tokens,
    write_dataset,
)

Policy = Callable[[Messages], dict[str, float]]
"""A shared policy: the conversation so far -> its reply distribution (it never sees the role)."""
REPLIES = 3
"""The most replies a policy below gives any conversation (the enumeration checks the mass)."""


def test_the_roles_answer_the_same_question_differently() -> None:
    assert [target("up", n) for n in (0, 3, 9)] == ["1", "4", "0"]
    assert [target("down", n) for n in (0, 3, 9)] == ["9", "2", "8"]
    assert all(target("up", n) != target("down", n) for n in range(10))


@pytest.mark.parametrize("reply", ["", "4", "2", "42", "24", "x", "4444", " 2 "])
def test_no_reply_scores_more_than_the_cap_across_both_roles(reply: str) -> None:
    """One shared policy gives both roles one reply distribution: the cap holds reply by reply."""
    mean = sum(charwise_reward(reply, target(role, 3)) for role in ROLES) / len(ROLES)
    assert mean <= SHARED_CAP


def test_the_roles_take_turns_each_asked_about_the_answer_just_given() -> None:
    calls: list[tuple[str, Messages]] = []
    answers = iter(["4", "3", "x", "2"])

    async def ask(role: str, messages: Messages) -> str:
        calls.append((role, [dict(m) for m in messages]))
        return next(answers)

    result = asyncio.run(play(ask, 3, turns=4, first="up"))
    assert [role for role, _ in calls] == ["up", "down", "up", "down"]
    # One conversation, resent whole each turn.
    assert [len(m) for _, m in calls] == [2, 4, 6, 8]
    assert all(calls[i + 1][1][: len(m)] == m for i, (_, m) in enumerate(calls[:-1]))
    # Each question is the answer just given ("x" is not a digit: n again).
    assert [m[-1]["content"] for _, m in calls] == ["After 3?", "After 4?", "After 3?", "After 3?"]
    assert calls[3][1][4] == {"role": "assistant", "content": "3"}
    # up: 4 right for 3, then x wrong; down: 3 right for 4, then 2, right for 3 but after the
    # baton was dropped, so it scores nothing.
    assert result["role_rewards"] == {"up": 0.5, "down": 0.5}
    assert result["reward"] == 0.5
    assert result["metrics"] == {"up_right": 0.5, "down_right": 0.5}


def test_a_payload_without_its_first_role_is_refused() -> None:
    """Data written before the relay has no ``first``: taking up-first for all would let one
    shared policy tell the roles apart by position."""
    from core.tasks.two_roles import first_role

    assert first_role({"n": 3, "first": "down"}) == "down"
    with pytest.raises(ValueError, match="needs 'first'.*delete the run directory's data"):
        first_role({"n": 3, "turns": 2})


def test_a_rollout_may_start_with_either_role() -> None:
    seen: list[str] = []

    async def ask(role: str, messages: Messages) -> str:
        seen.append(role)
        return target(role, 5)

    result = asyncio.run(play(ask, 5, turns=1, first="down"))
    assert seen == ["down"] and result["role_rewards"] == {"down": 1.0} and result["reward"] == 1.0
    with pytest.raises(ValueError, match="first role is one of"):
        asyncio.run(play(ask, 5, first="left"))
    with pytest.raises(ValueError, match="at least one turn"):
        asyncio.run(play(ask, 5, turns=0))


def test_a_reply_that_is_not_a_digit_hands_over_the_rollouts_digit() -> None:
    assert [next_question(r, 6) for r in ["4", " 8 ", "42", "", "x", "?"]] == [4, 8, 4, 6, 6, 6]


def test_a_policy_per_role_can_score_every_turn() -> None:
    async def ask(role: str, messages: Messages) -> str:
        return target(role, int(messages[-1]["content"].removeprefix("After ").removesuffix("?")))

    for n in range(10):
        for first in ROLES:
            result = asyncio.run(play(ask, n, turns=4, first=first))
            assert result["reward"] == 1.0 and result["role_rewards"] == {"up": 1.0, "down": 1.0}


def expected_reward(policy: Policy, n: int, turns: int) -> float:
    """The exact expected reward of one shared ``policy``: either role first (as the data draws
    it, half the time each), every path of replies, weighted by its probability."""
    return sum(_expected(policy, n, turns, first) for first in ROLES) / len(ROLES)


def _expected(policy: Policy, n: int, turns: int, first: str) -> float:
    total = mass = 0.0
    for path in itertools.product(range(REPLIES), repeat=turns):  # one call a turn
        picks, weight = iter(path), [1.0]

        async def ask(role: str, messages: Messages, picks: Iterator[int] = picks, weight: list[float] = weight) -> str:
            dist = sorted(policy(messages).items())
            pick = next(picks)
            if pick >= len(dist):  # a path this conversation's distribution does not have
                weight[0], pick = 0.0, 0
            reply, p = dist[pick]
            weight[0] *= p
            return reply

        result = asyncio.run(play(ask, n, turns, first))
        total += weight[0] * result["reward"]
        mass += weight[0]
    assert mass == pytest.approx(1.0), f"the paths hold {mass} of the probability"
    return total


def _digit(messages: Messages) -> int:
    return int(messages[-1]["content"][6])


def _hashed(messages: Messages) -> dict[str, float]:
    """Up's answer, down's and a third digit, weighted by a hash of the whole conversation: an
    arbitrary policy that reads the history and scores on both roles."""
    x = _digit(messages)
    h = hashlib.sha256(json.dumps(messages).encode()).digest()
    replies = sorted({str((x + 1) % 10), str((x - 1) % 10), str(h[0] % 10)})
    weights = [1 + b for b in h[1 : 1 + len(replies)]]
    return {r: w / sum(weights) for r, w in zip(replies, weights, strict=True)}


def _reverses(messages: Messages) -> dict[str, float]:
    """Bets on up at turn 1; then answers the opposite of the step the last answer took, which
    is this role's step whenever the last answer was right (the history gives the role away)."""
    x = _digit(messages)
    if len(messages) < 4:
        return {str((x + 1) % 10): 1.0}
    last = messages[-2]["content"]
    step = (int(last) - int(messages[-3]["content"][6])) % 10 if last.isdigit() else 1
    return {str((x - step) % 10): 1.0}


POLICIES: dict[str, Policy] = {
    "always up": lambda m: {str((_digit(m) + 1) % 10): 1.0},
    "half and half": lambda m: {str((_digit(m) + 1) % 10): 0.5, str((_digit(m) - 1) % 10): 0.5},
    # Bets that up speaks first and the roles alternate: up on odd turns, down on even ones.
    "by position": lambda m: {str((_digit(m) + (1 if len(m) % 4 == 2 else -1)) % 10): 1.0},
    # Plays up on the first turn, then copies the step the last answer took.
    "copies the last step": lambda m: (
        {str((_digit(m) + 1) % 10): 1.0}
        if len(m) < 4
        else {str((_digit(m) + int(m[-2]["content"]) - int(m[-3]["content"][6])) % 10): 1.0}
    ),
    "hashed": _hashed,
    "reverses the last step": _reverses,
}


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("turns", [1, 2, 3])
def test_one_shared_policy_is_capped_whatever_it_does(name: str, turns: int) -> None:
    """The exact expected reward (every path of replies, not a sample) of shared strategies that
    bet on the position, copy or reverse the last step, or weigh replies by the whole history:
    none passes the cap, as the module docstring argues for any."""
    for n in (0, 3):
        assert expected_reward(POLICIES[name], n, turns) <= SHARED_CAP + 1e-9


def test_the_exact_expectation_reaches_the_cap() -> None:
    """The enumeration is not vacuous: a policy that always plays one role scores the cap."""
    assert expected_reward(POLICIES["always up"], 3, 1) == pytest.approx(SHARED_CAP)
    assert expected_reward(POLICIES["half and half"], 3, 1) == pytest.approx(SHARED_CAP)
    # Reading the role off a right answer's step scores every later turn, yet only half the time.
    assert expected_reward(POLICIES["reverses the last step"], 3, 3) == pytest.approx(SHARED_CAP)
    assert 0.0 < expected_reward(POLICIES["hashed"], 3, 2) < SHARED_CAP
    # The coin is what holds the cap: were up always first, betting on position would win.
    assert _expected(POLICIES["by position"], 3, 2, "up") == 1.0
    assert expected_reward(POLICIES["by position"], 3, 2) == pytest.approx(SHARED_CAP)


def test_the_data_draws_questions_from_the_first_digits(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl"), rows=50, digits=2, turns=3)
    rows = [json.loads(line)["payload"] for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and {r["n"] for r in rows} == {0, 1} and {r["turns"] for r in rows} == {3}
    for n in (0, 1):  # each digit as often up-first as down-first, to one row
        firsts = [r["first"] for r in rows if r["n"] == n]
        assert abs(firsts.count("up") - firsts.count("down")) <= 1, firsts
    evals = [json.loads(line)["payload"] for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert evals == [{"n": n, "first": first, "turns": 3} for n in (0, 1) for first in ("down", "up")]
    with pytest.raises(ValueError, match="digits must be 1..10"):
        write_dataset(str(tmp_path / "a"), str(tmp_path / "b"), digits=11)
    with pytest.raises(ValueError, match="turns must be at least 1"):
        write_dataset(str(tmp_path / "a"), str(tmp_path / "b"), turns=0)


def test_the_tokenizer_keeps_each_question_whole() -> None:
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(tokenizer_corpus(), vocab_size=60, whole_tokens=tokenizer_tokens())
    for n in range(10):
        assert len(tok.encode(f"After {n}?", add_special_tokens=False)) == 1
    assert all(len(tok.encode(str(d), add_special_tokens=False)) == 1 for d in range(10))

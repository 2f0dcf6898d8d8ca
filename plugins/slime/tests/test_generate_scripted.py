"""``generate()`` under the local runtime with the model scripted (``ScriptedSampler``).

The sampler is the only stand-in (a model's output cannot be scripted); the
gateway, its HTTP server, the local runtime and the agents' openai SDK are
real. slime's ``Sample`` is the plugin's stand-in pinned to slime commit
624b824a898ab0ec1fcb4d373004c7f3852bf515 (slime is not installable here).
The same paths over real HTTP to an SGLang-shaped server are in
``test_generate_http.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import agent_overrides, compose_tracerl, slime_args
from slime_test_agents import score
from tracerl_slime.generate import generate, payload_of, sampling_of
from tracerl_slime.host import WorkerHost
from tracerl_slime.rewards import post_process_rewards
from tracerl_slime.sample import USING_STANDIN, Sample

from core.samplers import ScriptedSampler, encode_reply
from core.samplers.scripted import fake_logprob

pytestmark = [pytest.mark.integration]

SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 64,
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": False,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}


@pytest.fixture(scope="module")
def setup(slime_loop: Any, tiny_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    cfg = compose_tracerl(agent_overrides(tmp_path_factory.mktemp("slime_scripted")))
    sampler = ScriptedSampler(default=encode_reply(tiny_tokenizer, "ab"), tokenizer=tiny_tokenizer)
    WorkerHost.sampler_factory = lambda args, cfg, tok: sampler
    return slime_loop, slime_args(cfg), sampler


def _sample(mode: str, *, index: int, group: int = 0) -> Any:
    return Sample(
        group_index=group,
        index=index,
        prompt=f"prompt {index}",
        label="7",
        metadata={"tracerl_payload": {"mode": mode, "n": index}},
        session_id=f"slime-session-{index}",
    )


def _run(setup: Any, *samples: Any) -> list[list[Any]]:
    loop, args, _ = setup

    async def go() -> list[list[Any]]:
        return list(await asyncio.gather(*(generate(args, s, dict(SAMPLING)) for s in samples)))

    return loop.run_until_complete(go())


def test_uses_the_standin_sample_because_slime_is_absent() -> None:
    assert USING_STANDIN
    assert Sample.__module__ == "tracerl_slime._sample_standin"


def test_two_turn_rollout_one_sample_masks_logprobs_reward(setup: Any, tiny_tokenizer: Any) -> None:
    _, _, sampler = setup
    sampler.calls.clear()
    [out] = _run(setup, _sample("two_turn", index=3))
    assert len(out) == 1
    s = out[0]
    reply = encode_reply(tiny_tokenizer, "ab")
    first, second = (list(c.prompt_token_ids) for c in sampler.calls)
    obs = second[len(first) + len(reply) :]
    # tokens = exactly what the model read on turn 2 plus what it wrote
    assert s.tokens == second + reply
    assert s.tokens[: len(first)] == first
    assert s.response_length == len(s.tokens) - len(first)
    assert s.loss_mask == [1] * len(reply) + [0] * len(obs) + [1] * len(reply)
    lp = [fake_logprob(t, i) for i, t in enumerate(reply)]
    assert s.rollout_log_probs == pytest.approx(lp + [0.0] * len(obs) + lp)
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    # identity: slime's keys kept, rollout_id from index, reward set so slime skips its RM
    assert (s.group_index, s.index, s.rollout_id) == (0, 3, 3)
    assert s.label == "7" and s.session_id == "slime-session-3"
    assert s.reward == pytest.approx(score("ab"))
    assert s.status is Sample.Status.COMPLETED and not s.remove_sample
    assert s.metadata["tracerl"]["turns"] == 2 and s.metadata["tracerl"]["status"] == "ok"
    assert s.weight_versions == ["0", "0"]


def test_fork_gives_two_samples_sharing_rollout_id(setup: Any) -> None:
    [out] = _run(setup, _sample("fork", index=5, group=1))
    assert len(out) == 2
    assert {s.rollout_id for s in out} == {5}
    assert {s.group_index for s in out} == {1}
    assert len({s.reward for s in out}) == 1
    for s in out:
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        assert s.tokens[-s.response_length :] and sum(s.loss_mask) > 0
    # the rewritten-history row starts a new prompt: the rows differ
    assert out[0].tokens != out[1].tokens
    assert sorted(s.metadata["tracerl"]["row"] for s in out) == [0, 1]


@pytest.mark.parametrize(("mode", "status"), [("crash", "crashed"), ("no_call", "no_model_calls")])
def test_failed_rollout_is_one_removed_aborted_sample(setup: Any, mode: str, status: str) -> None:
    [out] = _run(setup, _sample(mode, index=9))
    assert len(out) == 1
    s = out[0]
    assert s.status is Sample.Status.ABORTED
    assert s.remove_sample
    assert s.loss_mask == [0] and s.rollout_log_probs == [0.0] and s.response_length == 1
    assert s.rollout_id == 9 and s.reward == 0.0
    assert s.metadata["tracerl"]["status"] == status
    assert s.metadata["tracerl"]["error"]


def test_length_cut_turn_marks_row_truncated(setup: Any, tiny_tokenizer: Any) -> None:
    _, _, sampler = setup
    long_reply = encode_reply(tiny_tokenizer, "abababababababab")
    assert len(long_reply) > 6  # algorithm.max_tokens=6 cuts it
    sampler.default = long_reply
    try:
        [out] = _run(setup, _sample("two_turn", index=11))
    finally:
        sampler.default = encode_reply(tiny_tokenizer, "ab")
    assert out[0].status is Sample.Status.TRUNCATED
    assert sum(out[0].loss_mask) == 12  # two turns of 6 generated tokens


def test_group_with_fork_and_failure_through_the_post_processor(setup: Any) -> None:
    """A group as slime would collect it: a plain rollout, a forked one, a crashed one."""
    _, args, _ = setup
    outs = _run(
        setup,
        _sample("two_turn", index=20, group=7),
        _sample("fork", index=21, group=7),
        _sample("crash", index=22, group=7),
    )
    flat = [s for out in outs for s in out]
    assert [len(o) for o in outs] == [1, 2, 1]
    raw, rewards = post_process_rewards(args, flat)
    assert len(raw) == len(rewards) == 4
    # both surviving rollouts have the same reward text ("ab"): zero advantage, no NaN
    assert rewards == pytest.approx([0.0, 0.0, 0.0, 0.0])


def test_sampling_from_slime_params(setup: Any) -> None:
    _, args, _ = setup
    from tracerl_slime.host import tracerl_config_of

    cfg = tracerl_config_of(args)
    p = sampling_of(
        cfg, {**SAMPLING, "temperature": 0.7, "top_k": 20, "stop": ["x"], "stop_token_ids": [5]}
    )
    assert (p.max_tokens, p.temperature, p.top_k, p.stop, p.stop_token_ids) == (
        6,
        0.7,
        20,
        ("x",),
        (5,),
    )
    # slime's remaining response budget caps the per-turn limit
    assert sampling_of(cfg, {**SAMPLING, "max_new_tokens": 3}).max_tokens == 3


def test_payload_from_slime_native_row() -> None:
    s = Sample(prompt="What is 2+2?", label="4", metadata={"source": "gsm8k"})
    assert payload_of(s) == {"prompt": "What is 2+2?", "label": "4", "source": "gsm8k"}


def test_missing_tracerl_config_names_the_fix(tmp_path: Path) -> None:
    from tracerl_slime.host import tracerl_config_of

    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="--custom-config-path"):
        tracerl_config_of(slime_args(None))

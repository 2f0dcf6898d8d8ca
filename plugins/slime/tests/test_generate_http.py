"""``generate()`` through the real HTTP SGLang sampler, as it runs inside slime.

The gateway's sampler is built by the plugin's default path
(``core.samplers`` kind ``sglang`` on ``http://{sglang_router_ip}:{sglang_router_port}``)
and talks real HTTP to ``sglang_standin`` (a starlette server with SGLang's
``/generate`` shapes; SGLang itself needs a GPU). Agents are real processes
under the local runtime using the openai SDK, including the repository's
example math agent. ``Sample`` is the plugin's stand-in pinned to slime
commit 624b824a898ab0ec1fcb4d373004c7f3852bf515.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import AGENTS_DIR, compose_tracerl, slime_args
from sglang_standin import StandIn, serve
from slime_test_agents import score
from tracerl_slime.generate import generate
from tracerl_slime.rewards import post_process_rewards
from tracerl_slime.sample import Sample

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
REPLIES = ["a", "ab", "abc", "b", "ba", "c"]
SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 512,
    "stop": None,
    "stop_token_ids": None,
}


def policy(text: str, n: int) -> str:
    """The stand-in model: the math agent gets a calculator call then an answer; others vary."""
    if "calculator tool" in text:
        if "<tool_response>" in text:
            return "3 * 7 = 21.\n#### 21"
        return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 7"}}\n</tool_call>'
    return REPLIES[n % len(REPLIES)]


@pytest.fixture(scope="module")
def env(
    slime_loop: Any, tiny_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    standin = StandIn(tokenizer=tiny_tokenizer, policy=policy)
    run_dir = tmp_path_factory.mktemp("slime_http")
    cfg = compose_tracerl(
        [
            "backend=slime",
            f"run_dir={run_dir}",
            "task.agent=slime_test_agents:app",
            f"+task.agent_env.PYTHONPATH={AGENTS_DIR}:{ROOT}",
            "runtime.num_processes=1",
            "gateway.history_mode=tree",
            "algorithm.max_tokens=96",
            "trainer.rollout_timeout_s=60",
            "+backend.sampler.health_interval_s=0",
        ]
    )
    with serve(standin) as port:
        yield slime_loop, slime_args(cfg, sglang_router_port=port), standin


def _run(env: Any, *samples: Any) -> list[list[Any]]:
    loop, args, _ = env

    async def go() -> list[list[Any]]:
        return list(await asyncio.gather(*(generate(args, s, dict(SAMPLING)) for s in samples)))

    return loop.run_until_complete(go())


def _sample(payload: dict[str, Any], *, index: int, group: int) -> Any:
    return Sample(group_index=group, index=index, prompt="p", metadata={"tracerl_payload": payload})


def _check_served(sample: Any, standin: StandIn) -> int:
    """Every trained span of ``sample`` is exactly one served reply, logprobs included."""
    by_prompt: dict[tuple[int, ...], list[Any]] = {}
    for sv in standin.served:  # sessions may send identical prompts (e.g. the fork's "again")
        by_prompt.setdefault(tuple(sv.input_ids), []).append(sv)
    start = len(sample.tokens) - sample.response_length
    mask, lps = sample.loss_mask, sample.rollout_log_probs
    spans, i = 0, 0
    while i < len(mask):
        if mask[i] == 0:
            assert lps[i] == 0.0
            i += 1
            continue
        j = i
        while j < len(mask) and mask[j] == 1:
            j += 1
        span = sample.tokens[start + i : start + j]
        candidates = [
            sv for sv in by_prompt[tuple(sample.tokens[: start + i])] if sv.output_ids == span
        ]
        assert candidates, f"trained span {span} was never served after this prompt"
        assert any(lps[i:j] == pytest.approx(sv.logprobs) for sv in candidates)
        spans, i = spans + 1, j
    return spans


def test_group_of_rollouts_over_http(env: Any) -> None:
    _, args, standin = env
    standin.served.clear()
    outs = _run(env, *[_sample({"mode": "two_turn", "n": k}, index=k, group=0) for k in range(4)])
    flat = [s for o in outs for s in o]
    assert [len(o) for o in outs] == [1, 1, 1, 1]
    for k, s in enumerate(flat):
        assert s.rollout_id == k and s.group_index == 0
        assert _check_served(s, standin) == 2  # two generated turns, tool text between them masked
        reply = s.response.split("<|im_end|>")[-2].rsplit("\n", 1)[-1]  # the second answer
        assert s.reward == pytest.approx(score(reply))
        assert s.weight_versions == ["3", "3"]
    # sgl-router affinity: one key per session, never the session id itself
    keys = {sv.routing_key for sv in standin.served}
    assert None not in keys and len(keys) == 4
    assert all(sv.sampling_params["no_stop_trim"] is True for sv in standin.served)
    raw, rewards = post_process_rewards(args, flat)
    assert len(set(raw)) > 1  # the stand-in's replies differ in score (REPLIES cycle)
    assert sum(rewards) == pytest.approx(0.0, abs=1e-5)
    assert all((r > 0) == (x > sum(raw) / 4) for r, x in zip(rewards, raw, strict=True))


def test_forked_rollouts_and_failures_over_http(env: Any) -> None:
    _, args, standin = env
    outs = _run(
        env,
        _sample({"mode": "fork", "n": 1}, index=10, group=1),
        _sample({"mode": "fork", "n": 2}, index=11, group=1),
        _sample({"mode": "two_turn", "n": 3}, index=12, group=1),
        _sample({"mode": "crash", "n": 4}, index=13, group=1),
    )
    assert [len(o) for o in outs] == [2, 2, 1, 1]
    for o, rid in zip(outs, [10, 11, 12, 13], strict=True):
        assert {s.rollout_id for s in o} == {rid}
    for s in [s for o in outs[:3] for s in o]:
        assert _check_served(s, standin) >= 1
    crashed = outs[3][0]
    assert crashed.status is Sample.Status.ABORTED and crashed.remove_sample
    flat = [s for o in outs for s in o]
    raw, rewards = post_process_rewards(args, flat)
    # the expected values, computed from one reward per surviving rollout, with core's
    # spread (algorithm.std=population by default, eps 1e-4)
    per_rollout = {o[0].rollout_id: o[0].reward for o in outs[:3]}
    vals = list(per_rollout.values())
    mean = sum(vals) / 3
    std = (sum((v - mean) ** 2 for v in vals) / 3) ** 0.5
    expected = [(s.reward - mean) / (std + 1e-4) for o in outs[:3] for s in o] + [0.0]
    assert rewards == pytest.approx(expected, abs=1e-5)


def test_example_math_agent_multi_turn_over_http(env: Any, tiny_tokenizer: Any) -> None:
    _, _, standin = env
    payload = {"mode": "math", "prompt": "What is 3 times 7?", "answer": "21"}
    outs = _run(env, *[_sample(payload, index=20 + k, group=2) for k in range(2)])
    for o in outs:
        assert len(o) == 1
        s = o[0]
        assert s.status is Sample.Status.COMPLETED, s.metadata
        assert s.reward == 1.0, s.response
        assert _check_served(s, standin) == 2
        masked = tiny_tokenizer.decode(
            [t for t, m in zip(s.tokens[-s.response_length :], s.loss_mask, strict=True) if m == 0]
        )
        assert (
            "21" in masked and "<tool_response>" in masked
        )  # the calculator's output is not trained
        trained = tiny_tokenizer.decode(
            [t for t, m in zip(s.tokens[-s.response_length :], s.loss_mask, strict=True) if m == 1]
        )
        assert (
            re.search(r"<tool_call>.*calculator.*</tool_call>", trained, re.S)
            and "#### 21" in trained
        )

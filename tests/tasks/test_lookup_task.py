"""The lookup task (core/tasks/lookup.py): its reward, data, tokenizer, and one run of the
agent (official openai SDK, in a local-runtime process) against the real gateway and
tool parser, with only the model scripted (``ScriptedSampler``: a real model's output
cannot be scripted; everything else is the real stack)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from core.tasks import lookup as task
from core.tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tok() -> Any:
    """The tokenizer the local backend builds for task=lookup (core/conf/task/lookup.yaml)."""
    return build_tiny_tokenizer(
        task.tokenizer_corpus(), vocab_size=100, whole_tokens=task.tokenizer_tokens()
    )


def test_reward_pays_nothing_without_a_call_and_the_answer_only_after_the_asked_lookup() -> None:
    table = {k: str(i) for i, k in enumerate(task.KEYS)}
    asked = task.KEYS[-1]
    right = table[asked]
    wrong = str((int(right) + 1) % 10)
    assert task.lookup_reward([], asked, table, right) == 0.0  # a guess, even a right one
    assert task.lookup_reward([asked], asked, table, None) == 0.0  # called, never answered
    assert task.lookup_reward([asked], asked, table, right) == 1.0
    assert task.lookup_reward([asked], asked, table, "") == task.CALL_CREDIT
    # No credit for the answer's form: a wrong digit earns what any other reply does.
    assert task.lookup_reward([asked], asked, table, wrong) == task.CALL_CREDIT
    assert task.lookup_reward([asked], asked, table, "x") == task.CALL_CREDIT
    assert task.lookup_reward([asked], asked, table, right + "xx") == pytest.approx(0.2 + 0.8 / 3)
    assert task.lookup_reward(["z"], asked, table, right) == task.CALL_CREDIT


def test_dataset_draws_values_per_row_and_covers_every_key_in_eval(tmp_path: Path) -> None:
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    task.write_dataset(str(train), str(evals), rows=200, seed=1)
    rows = [json.loads(line)["payload"] for line in train.read_text().splitlines()]
    assert len(rows) == 200
    assert all(set(r["table"]) == set(task.KEYS) and r["key"] in task.KEYS for r in rows)
    # The value is not a function of the prompt: one asked key sees many values.
    values = {r["table"][r["key"]] for r in rows if r["key"] == task.KEYS[0]}
    assert len(values) >= 8
    eval_rows = [json.loads(line)["payload"] for line in evals.read_text().splitlines()]
    assert {r["key"] for r in eval_rows} == set(task.KEYS)


def test_payload_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="'table'"):
        task._parse_payload({"key": "a", "table": "a=1"})
    with pytest.raises(ValueError, match="'key' must be one of"):
        task._parse_payload({"key": "q", "table": {"a": "1"}})


def test_tokenizer_keeps_the_tools_block_and_each_call_whole(tok: Any) -> None:
    for key in task.KEYS:
        ids = tok.encode(task.call_text(key), add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids) == task.call_text(key)
    prompt = tok.apply_chat_template(
        [{"role": "system", "content": task.SYSTEM}, {"role": "user", "content": task.question("a")}],
        tools=[task.LOOKUP_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok.encode(prompt, add_special_tokens=False)
    assert len(ids) <= 25 and tok.decode(ids) == prompt  # the 556-character tools block is one token
    assert len(tok) <= 100 + len(task.tokenizer_tokens())


def test_whole_tokens_are_left_out_of_the_merges() -> None:
    """Without ``whole_tokens`` the same corpus spends merges on the tools block and the
    prompt is several times longer."""
    plain = build_tiny_tokenizer(task.tokenizer_corpus(), vocab_size=100)
    text = task._render(task._chat(task.KEYS[0], "7"))
    whole = build_tiny_tokenizer(
        task.tokenizer_corpus(), vocab_size=100, whole_tokens=task.tokenizer_tokens()
    )
    assert len(plain.encode(text)) > 4 * len(whole.encode(text))


@pytest.mark.integration
def test_agent_runs_the_tool_through_the_real_gateway_and_the_trace_masks_its_result(
    tok: Any, tmp_path: Path
) -> None:
    """Scripted replies per rollout: the asked call then the right answer (1.0), the asked
    call then a wrong digit (CALL_CREDIT), a right guess without a call
    (0.0), a call followed by more text (ill-formed: the parser refuses it, no tool runs,
    0.0), two calls in one turn then the answer (parallel_tool_calls=False: the gateway
    returns the first, the agent runs one), and calls in both turns (no answer, 0.0). The
    row of a two-turn rollout is the conversation token for token, trains both turns and
    nothing between them (the tool result)."""
    from core.gateway import Gateway, GatewayConfig, GatewayServer
    from core.runtime.local import LocalRuntime
    from core.samplers import ScriptedSampler, encode_reply
    from core.types import RolloutRequest, RolloutStatus, SamplingParams

    asked, table = task.KEYS[0], {k: str((3 + i) % 10) for i, k in enumerate(task.KEYS)}
    value = table[asked]
    wrong = str((int(value) + 1) % 10)
    call = task.call_text(asked)
    cases = [
        ([call, value], 1.0, 2, 1),
        ([call, wrong], task.CALL_CREDIT, 2, 1),
        ([value], 0.0, 1, 0),
        ([call + " " + value], 0.0, 1, 0),
        ([call + call, value], 1.0, 2, 1),
        ([call, call], 0.0, 2, 2),
    ]

    async def main() -> None:
        sampler = ScriptedSampler(tokenizer=tok)
        gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(), model_id="tiny")
        server = GatewayServer(gw, host="127.0.0.1", port=0)
        await server.start()
        rt = LocalRuntime("core.tasks.lookup:app", num_processes=1, workdir=str(tmp_path))
        try:
            await rt.start()
            requests = []
            for i, (texts, *_) in enumerate(cases):
                sid = gw.create_session(
                    sampling=SamplingParams(max_tokens=8),
                    metadata={"rollout_id": f"r{i}", "group_id": "g0"},
                )
                sampler.push(*(encode_reply(tok, t) for t in texts), session_id=sid)
                requests.append(
                    RolloutRequest(
                        rollout_id=f"r{i}",
                        group_id="g0",
                        payload={"key": asked, "table": table},
                        base_url=server.base_url,
                        session_id=sid,
                        model_id="tiny",
                        sampling_params={"temperature": 1.0, "max_tokens": 8},
                        timeout_s=60,
                    )
                )
            results = await asyncio.gather(*(rt.run_rollout(r) for r in requests))
            for (texts, reward, turns, calls), req, res in zip(cases, requests, results, strict=True):
                assert res.status is RolloutStatus.OK, res.error
                assert res.reward == pytest.approx(reward), texts
                assert res.metrics["turns"] == turns
                (row,) = gw.finish_session(req.session_id)
                row.validate()
                assert len(row.turns) == turns
                assert res.metrics["tool_calls"] == calls
                if turns == 2 and texts[0] == call:
                    first, second = row.turns
                    assert row.token_ids[first.start : first.end] == encode_reply(tok, call)
                    between = row.token_ids[first.end : second.start]
                    assert all(m == 0 for m in row.loss_mask[first.end : second.start])
                    assert tok.decode(between) == (
                        f"\n<|im_start|>user\n<tool_response>\n{value * task.REPEAT}\n</tool_response>"
                        "<|im_end|>\n<|im_start|>assistant\n"
                    )
                    assert all(row.loss_mask[t] == 1 for s in row.turns for t in range(s.start, s.end))
                    assert row.prompt_length <= 25
        finally:
            await rt.aclose()
            await server.stop()

    asyncio.run(main())

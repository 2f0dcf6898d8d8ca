"""The trace files ``python -m core.view`` reads: exact round trip, size, and files cut short."""

from __future__ import annotations

import asyncio
import gzip
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from core.gateway.history import Node, Turn
from core.rollout import RolloutOutcome
from core.rundir.traces import (
    LOGPROB_DECIMALS,
    TraceWriter,
    conversation_tree,
    list_traces,
    read_traces,
    rows_of,
    trace_path,
)
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)


def _row(rng: random.Random, ids: list[int], prompt: int, spans: list[tuple[int, int, int]], index: int) -> TraceRecord:
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    turns = []
    for s, e, version in spans:
        mask[s:e] = [1] * (e - s)
        logprobs[s:e] = [-rng.random() * 5 for _ in range(e - s)]
        turns.append(TurnSpan(s, e, FinishReason.STOP, version))
    return TraceRecord(
        session_id="tr-x",
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=prompt,
        turns=turns,
        row_index=index,
        metadata={"turns": len(spans), "truncated": False, "turn_params": [{"temperature": 1.0}]},
    )


def _outcome(rid: str, group: str, rows: list[TraceRecord], status: RolloutStatus, reward: float | None) -> RolloutOutcome:
    request = RolloutRequest(
        rollout_id=rid,
        group_id=group,
        payload={"n": 3, "_config": {"api_key": "secret"}},
        base_url="http://x/v1",
        session_id="tr-x",
        model_id="m",
    )
    result = RolloutResult(
        rollout_id=rid,
        status=status,
        reward=reward,
        error=None if status is RolloutStatus.OK else "Traceback ...\nRuntimeError: boom",
        elapsed_s=0.25,
    )
    conversation = [
        {"parent": -1, "messages": [{"role": "user", "content": "After 3? </script><b>x</b>"}], "turn": None},
        {"parent": 0, "messages": [{"role": "assistant", "content": "4"}], "turn": 0},
    ]
    return RolloutOutcome(request=request, result=result, rows=rows, faults={"model_turns": 1}, conversation=conversation)


def _forked_rollout(rng: random.Random) -> list[TraceRecord]:
    """Two rows of a tree-mode session: the second forks after the first turn (shared prefix)."""
    trunk = [rng.randrange(1000) for _ in range(60)]
    a = trunk + [rng.randrange(1000) for _ in range(30)]
    b = trunk + [rng.randrange(1000) for _ in range(25)]
    row_a = _row(rng, a, 20, [(20, 40, 1), (50, 90, 2)], 0)
    row_b = _row(rng, b, 20, [(20, 40, 1), (70, 85, 2)], 1)
    # a shared turn is trained in the first row only
    row_b.loss_mask[20:40] = [0] * 20
    row_b.logprobs[20:40] = [0.0] * 20
    return [row_a, row_b]


def test_round_trip_gives_back_the_exact_rows(tmp_path: Path) -> None:
    rng = random.Random(0)
    outcomes = [
        _outcome("r0", "s1-g0", _forked_rollout(rng), RolloutStatus.OK, 0.5),
        _outcome("r1", "s1-g0", [], RolloutStatus.CRASHED, None),
    ]
    writer = TraceWriter(tmp_path, 1, decode=lambda ids: f"<{ids[0]}>")
    stats = writer.write_step(1, outcomes, {"r0": 0.75}, weight_version=7)
    path = trace_path(tmp_path, "train", 1)
    assert stats["traces/bytes"] == path.stat().st_size
    got = read_traces(path)
    assert not got.partial
    assert got.header["kind"] == "train" and got.header["step"] == 1 and got.header["rollouts"] == 2
    assert got.header["weight_version"] == 7
    some = outcomes[0].rows[0].token_ids[5]
    assert got.header["tokens"][str(some)] == f"<{some}>"
    first, failed = got.rollouts
    assert first["advantage"] == 0.75 and first["reward"] == 0.5 and first["status"] == "ok"
    assert first["payload"] == {"n": 3}  # the session key in _config is not stored
    assert first["conversation"][0]["messages"][0]["content"] == "After 3? </script><b>x</b>"
    assert failed["status"] == "crashed" and failed["reward"] is None and "boom" in failed["error"]
    assert first["rows"][1]["base"] == [0, 60]  # the fork stores only what follows the shared prefix
    for original, back in zip(outcomes[0].rows, rows_of(first), strict=True):
        back.validate()
        assert back.token_ids == original.token_ids
        assert back.loss_mask == original.loss_mask
        assert back.turns == original.turns
        assert back.prompt_length == original.prompt_length and back.row_index == original.row_index
        assert back.logprobs == pytest.approx(original.logprobs, abs=10**-LOGPROB_DECIMALS)
        assert back.rollout_id == "r0" and back.reward == 0.5 and back.status is RolloutStatus.OK
        assert back.metadata == original.metadata
    assert set(got.header["tokens"]) == {str(i) for r in outcomes[0].rows for i in r.token_ids}


def _spy(name: str, run: Any, ran_on: dict[str, int]) -> Any:
    def spy(*args: Any) -> Any:
        ran_on[name] = threading.get_ident()
        return run(*args)

    return spy


def test_the_loop_writes_traces_off_the_event_loop(tmp_path: Path) -> None:
    """``awrite_step`` (the training loop's) encodes and writes in a worker thread, so
    other tasks on the event loop (the gateway, the async rollout pool) run meanwhile;
    ``write_step`` held the loop for the whole encoding (seconds for a large step). New
    token ids are still decoded on the loop thread, where the gateway's tokenizer lives.
    The file is the one ``write_step`` writes."""
    rng = random.Random(3)
    outcomes = [_outcome(f"r{k}", "g", _forked_rollout(rng), RolloutStatus.OK, 1.0) for k in range(20)]
    decoded_on: set[int] = set()

    def decode(ids: list[int]) -> str:
        decoded_on.add(threading.get_ident())
        return f"<{ids[0]}>"

    async def main() -> tuple[int, dict[str, float]]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        writer = TraceWriter(tmp_path / "a", 1, decode)
        for name in ("_encode", "_write"):  # the real methods, recording the thread they run on
            setattr(writer, name, _spy(name, getattr(writer, name), ran_on))
        stats = await writer.awrite_step(2, outcomes, {"r1": 0.5}, weight_version=1)
        during = ticks - before
        task.cancel()
        return during, stats

    ran_on: dict[str, int] = {}
    during, stats = asyncio.run(main())
    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    assert set(ran_on) == {"_encode", "_write"} and loop_thread not in ran_on.values()
    assert during > 0  # the loop ran other tasks while the step's traces were written
    assert decoded_on == {loop_thread}
    assert stats["traces/bytes"] == trace_path(tmp_path / "a", "train", 2).stat().st_size
    TraceWriter(tmp_path / "b", 1, decode).write_step(2, outcomes, {"r1": 0.5}, weight_version=1)
    a, b = read_traces(trace_path(tmp_path / "a", "train", 2)), read_traces(trace_path(tmp_path / "b", "train", 2))
    assert a.rollouts == b.rollouts and {**a.header, "time": 0} == {**b.header, "time": 0}


def test_size_per_thousand_toy_rollouts_stays_small(tmp_path: Path) -> None:
    """The toy task's shape (a 21-token prompt, up to 8 generated tokens, ~120-token
    vocabulary): 1,000 rollouts measured at 141 kB; this bounds it at 250 kB."""
    rng = random.Random(1)
    prompt = [1, 75, 36, 72, 69, 77, 76, 3, 2, 36, 1, 66, 36, 71, 86, 16, 2, 36, 1, 78, 36]
    outcomes = []
    for k in range(1000):
        gen = [rng.randrange(120) for _ in range(rng.randint(2, 8))]
        ids = prompt + gen
        outcomes.append(
            _outcome(f"{k:032x}", f"s1-g{k // 16}", [_row(rng, ids, 21, [(21, len(ids), 0)], 0)], RolloutStatus.OK, 0.0)
        )
    stats = TraceWriter(tmp_path, 1, decode=lambda ids: chr(65 + ids[0] % 26)).write_step(1, outcomes, {})
    assert stats["traces/bytes"] < 250_000, stats


def test_a_file_cut_short_gives_the_rollouts_before_the_cut(tmp_path: Path) -> None:
    rng = random.Random(2)
    outcomes = [_outcome(f"r{k}", "g", _forked_rollout(rng), RolloutStatus.OK, 1.0) for k in range(40)]
    TraceWriter(tmp_path, 1).write_step(4, outcomes, {})
    path = trace_path(tmp_path, "train", 4)
    whole = path.read_bytes()
    full = read_traces(path)
    assert len(full.rollouts) == 40 and not full.partial
    cut = tmp_path / "traces" / "train_000005.jsonl.gz"
    seen = []
    for fraction in (0.3, 0.6, 0.95):
        cut.write_bytes(whole[: int(len(whole) * fraction)])
        got = read_traces(cut)
        assert got.partial
        assert got.rollouts == full.rollouts[: len(got.rollouts)]
        seen.append(len(got.rollouts))
    assert seen == sorted(seen) and seen[-1] > 0
    # a file being written under its .tmp name is not listed
    (tmp_path / "traces" / "train_000006.jsonl.gz.tmp").write_bytes(whole[:100])
    assert list_traces(tmp_path) == {"train": [4, 5], "eval": []}


def test_files_that_are_not_traces_say_so(tmp_path: Path) -> None:
    bad = tmp_path / "train_000001.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="not a readable trace file"):
        read_traces(bad)
    bad.write_bytes(gzip.compress(b'{"format": 99}\n'))
    with pytest.raises(ValueError, match="newer than this tracerl reads"):
        read_traces(bad)
    bad.write_bytes(gzip.compress(b"")[:5])
    with pytest.raises(ValueError, match="no header"):
        read_traces(bad)


def test_every_n_steps_and_off(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, 3)
    assert [s for s in range(1, 10) if writer.wants("train", s)] == [3, 6, 9]
    assert writer.wants("eval", 1)
    off = TraceWriter(tmp_path, 0)
    assert off.write_step(3, [_outcome("r", "g", [], RolloutStatus.CRASHED, None)], {}) == {}
    assert not (tmp_path / "traces").exists()
    with pytest.raises(ConfigError, match="save_traces"):
        TraceWriter(tmp_path, -1)


def test_only_the_newest_keep_training_steps_are_kept(tmp_path: Path) -> None:
    """``trainer.keep_traces``: after each training step's file, files past the newest
    ``keep`` are deleted (a run kept every step before); evaluations are all kept, and
    a replay after a crash leaves the later steps' files to be rewritten."""
    one = [_outcome("r", "g", [], RolloutStatus.CRASHED, None)]
    writer = TraceWriter(tmp_path, 2, keep=2)
    for step in range(1, 10):
        writer.write_step(step, one, {})
        writer.write_step(step, one, {}, kind="eval")
    assert list_traces(tmp_path) == {"train": [6, 8], "eval": list(range(1, 10))}
    asyncio.run(writer.awrite_step(4, one, {}))  # resumed from step 3: 6 and 8 are replayed next
    assert list_traces(tmp_path)["train"] == [4, 6, 8]
    asyncio.run(writer.awrite_step(6, one, {}))
    assert list_traces(tmp_path)["train"] == [4, 6, 8]
    asyncio.run(writer.awrite_step(8, one, {}))
    assert list_traces(tmp_path)["train"] == [6, 8]
    all_kept = TraceWriter(tmp_path / "all", 1)
    for step in range(1, 5):
        all_kept.write_step(step, one, {})
    assert list_traces(tmp_path / "all")["train"] == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="trainer.keep_traces must be an integer >= 0"):
        TraceWriter(tmp_path, 1, keep=-1)


def test_conversation_tree_keeps_forks_and_turn_indices() -> None:
    def turn() -> Turn:
        return Turn(buf=[], prompt_len=0, end=0, logprobs=[], finish_reason=FinishReason.STOP,
                    weight_version=0, params={}, parent=None, emitted_closer="")

    t0, t1, t2 = turn(), turn(), turn()
    root = Node(canon=[])
    user = Node(canon=[{"role": "user", "content": "hi"}])
    root.children.append(user)
    first = Node(canon=[{"role": "assistant", "content": "a"}], turn=t0)
    user.children.append(first)
    # two continuations of the first reply: a fork
    for t, text in ((t1, "b"), (t2, "c")):
        tool = Node(canon=[{"role": "tool", "content": text}])
        first.children.append(tool)
        tool.children.append(Node(canon=[{"role": "assistant", "content": text * 2}], turn=t))
    tree = conversation_tree(root, [t0, t1, t2])
    assert [(n["parent"], n["messages"][0]["content"], n["turn"]) for n in tree] == [
        (-1, "hi", None), (0, "a", 0), (1, "b", None), (2, "bb", 1), (1, "c", None), (4, "cc", 2),
    ]
    assert tree[3]["weight_version"] == 0 and tree[3]["finish_reason"] == "stop"

"""Trace files (``core.rundir.traces``): size and write time of a toy step, and what a large
step's encoding costs the event loop written on it or from the worker thread.

- ``toy``: a 5-step run of the default task (``python -m core.train``, 256 rollouts a step):
  its trace files' bytes a step and per 1,000 rollouts, and the write time the loop recorded.
- ``large``: one step of 64 rollouts with four rows each of 4,000 to 10,000 tokens (ids over a
  150k vocabulary, half of each row trained): the CPU seconds of ``write_step``, the longest
  gap between ticks of another task while ``write_step`` runs on the loop, and the same while
  ``awrite_step`` (the training loop's) runs.

    python benchmarks/traces.py
    python benchmarks/traces.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from core.rollout import RolloutOutcome
from core.rundir.traces import TraceWriter, list_traces, read_traces, trace_path
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)


def _outcome(rid: str, group: str, rows: list[TraceRecord]) -> RolloutOutcome:
    request = RolloutRequest(rollout_id=rid, group_id=group, payload={"n": 3}, base_url="http://x/v1",
                             session_id=rid, model_id="m")
    result = RolloutResult(rollout_id=rid, status=RolloutStatus.OK, reward=1.0, error=None, elapsed_s=0.25)
    conversation = [{"parent": -1, "messages": [{"role": "user", "content": "After 3?"}], "turn": None},
                    {"parent": 0, "messages": [{"role": "assistant", "content": "4"}], "turn": 0}]
    return RolloutOutcome(request=request, result=result, rows=rows, faults={"model_turns": 1},
                          conversation=conversation)


def _row(rng: random.Random, ids: list[int], prompt: int, index: int) -> TraceRecord:
    n = len(ids)
    return TraceRecord(
        session_id="s", token_ids=ids, loss_mask=[0] * prompt + [1] * (n - prompt),
        logprobs=[0.0] * prompt + [-rng.random() * 5 for _ in range(n - prompt)], prompt_length=prompt,
        turns=[TurnSpan(prompt, n, FinishReason.STOP, 0)], row_index=index,
        metadata={"turns": 1, "truncated": False},
    )


def toy(out: Path, steps: int = 5) -> dict[str, Any]:
    """A short run of the default task (``python -m core.train``): its trace files and the
    write time the loop recorded (``time/traces``)."""
    run_dir = out / "toy"
    cmd = [sys.executable, "-m", "core.train", f"trainer.max_steps={steps}", "trainer.progress=false", f"run_dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-1500:]}")
    files = [trace_path(run_dir, "train", step) for step in list_traces(run_dir)["train"]]
    sizes = [f.stat().st_size for f in files]
    rollouts = [int(read_traces(f).header["rollouts"]) for f in files]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    write_ms = [float(r["time/traces"]) * 1000 for r in records if "time/traces" in r]
    step_s = [float(r["time/step"]) for r in records if "time/step" in r]
    return {
        "steps": len(files),
        "rollouts_per_step": statistics.median(rollouts),
        "kB_per_step": round(statistics.median(sizes) / 1000, 1),
        "kB_per_1000_rollouts": round(sum(sizes) / sum(rollouts), 1),
        "median_write_ms_per_step": round(statistics.median(write_ms), 1),
        "median_step_s": round(statistics.median(step_s), 2),
    }


async def _longest_gap(work: Any) -> float:
    """The longest time another task on the loop waited between two ticks while ``work`` ran."""
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await work()
    done = True
    await task
    return max(gaps, default=0.0)


def large(out: Path, rollouts: int = 64, rows: int = 4) -> dict[str, Any]:
    rng = random.Random(2)
    outcomes = []
    tokens = 0
    for k in range(rollouts):
        made = []
        for i in range(rows):
            n = rng.randint(4000, 10000)
            made.append(_row(rng, [rng.randrange(150_000) for _ in range(n)], n // 2, i))
            tokens += n
        outcomes.append(_outcome(f"r{k:031x}", f"g{k // 8}", made))

    def decode(ids: list[int]) -> str:
        return f"<{ids[0]}>"

    cpu = time.process_time()
    stats = TraceWriter(out / "cpu", 1, decode).write_step(1, outcomes, {})
    encode_cpu_s = time.process_time() - cpu

    async def on_loop() -> None:
        TraceWriter(out / "loop", 1, decode).write_step(1, outcomes, {})

    async def off_loop() -> None:
        await TraceWriter(out / "thread", 1, decode).awrite_step(1, outcomes, {})

    return {
        "rollouts": rollouts,
        "row_tokens": tokens,
        "MB": round(stats["traces/bytes"] / 1e6, 1),
        "write_step_cpu_s": round(encode_cpu_s, 2),
        "longest_loop_stall_s_written_on_the_loop": round(asyncio.run(_longest_gap(on_loop)), 2),
        "longest_loop_stall_s_awrite_step": round(asyncio.run(_longest_gap(off_loop)), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tracerl-traces-") as tmp:
        result = {"toy": toy(Path(tmp)), "large": large(Path(tmp))}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Synchronous vs asynchronous training on the long-tailed toy task, side by side.

Runs the embedded default (``python -m core.train``: local backend, tiny
model, succ_digit) with the task's long-tail option (each rollout waits its own
seeded lognormal delay after its model call, median ``--p50`` seconds,
p99/p50 = ``--ratio``: a slow tool or environment) once per mode, one
process at a time, and prints per mode: steps/s, rollouts/s, the fraction of
the wall time the trainer waited for rollouts and the sampler had no
training rollout, mean/max staleness, groups dropped as stale, the step and
training wall time at which the trailing mean reward first reached
``--target``, and the final trailing mean reward (every mode trains the same
number of rollouts: ``--steps`` x batch x group).

    python benchmarks/async_loop.py                       # sync, async s=0, async s=1; 300 steps
    python benchmarks/async_loop.py --steps 60 --modes sync async1
    python benchmarks/async_loop.py -- trainer.batch_size=8   # extra Hydra overrides for every run
    python benchmarks/async_loop.py --workloads independent correlated --slowdown 5

Workloads: ``independent`` (the delay does not depend on the answer) and
``correlated`` (``+task.generator_kwargs.long_tail_fail_slowdown=--slowdown``: a
rollout whose reply is wrong waits that many times longer, as an agent whose
failures loop to the turn cap); each runs every mode with the same seed, and the
table prints them side by side, with wasted rollouts, the share of trained groups
with a nonzero advantage and the failure rate the guard saw.

Modes: ``sync`` (trainer.mode=sync), ``asyncK`` (trainer.mode=async,
trainer.max_staleness=K). Wall times are the loop's own (``time/train_wall``:
no imports, model build or agent start-up). Exit status 0 when every run finished.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.rundir.metrics import read_metrics  # noqa: E402


@dataclass
class ModeResult:
    """One run's figures."""

    mode: str
    workload: str
    steps: int
    wall_s: float
    steps_per_s: float
    rollouts_per_s: float
    trainer_idle: float
    sampler_idle: float
    staleness_mean: float
    staleness_max: int
    wasted: int
    signal_share: float
    failure_rate: float
    reached_step: int | None
    reached_s: float | None
    final_reward: float
    returncode: int


def mode_overrides(mode: str) -> list[str]:
    """Hydra overrides of ``sync`` or ``asyncK``."""
    if mode == "sync":
        return ["trainer.mode=sync"]
    if mode.startswith("async") and mode[5:].isdigit():
        return ["trainer.mode=async", f"trainer.max_staleness={int(mode[5:])}"]
    raise SystemExit(f"unknown mode {mode!r}; use sync or asyncK (K = max_staleness, e.g. async1)")


def summarise(
    mode: str, records: list[dict[str, Any]], *, target: float, window: int, rc: int, workload: str = "independent"
) -> ModeResult:
    """Figures of one run's ``metrics.jsonl`` records."""
    steps = [r for r in records if "reward/mean" in r]
    final = [r for r in records if "time/train_wall" in r]
    step_times = [float(r["time/step"]) for r in steps]
    wall = float(final[-1]["time/train_wall"]) if final else sum(step_times)
    rewards = [float(r["reward/mean"]) if r["reward/mean"] is not None else 0.0 for r in steps]
    reached_step = reached_s = None
    elapsed = 0.0
    for i, dt in enumerate(step_times):
        elapsed += dt
        chunk = rewards[max(0, i + 1 - window) : i + 1]
        if reached_step is None and i + 1 >= window and sum(chunk) / len(chunk) >= target:
            reached_step, reached_s = i + 1, elapsed
    tail = rewards[-window:] or [math.nan]

    def total(key: str) -> float:
        return sum(float(r.get(key) or 0.0) for r in steps)

    ages = [float(r.get("async/staleness_mean") or 0.0) for r in steps]
    groups = total("groups/total")
    silent = total("groups/skipped_constant") + total("groups/skipped_too_small")
    return ModeResult(
        mode=mode,
        workload=workload,
        steps=len(steps),
        wall_s=wall,
        steps_per_s=len(steps) / wall if wall > 0 else 0.0,
        rollouts_per_s=total("rollouts/finished") / wall if wall > 0 else 0.0,
        trainer_idle=total("time/trainer_idle") / wall if wall > 0 else 0.0,
        sampler_idle=total("time/sampler_idle") / wall if wall > 0 else 0.0,
        staleness_mean=sum(ages) / len(ages) if ages else 0.0,
        staleness_max=int(max((float(r.get("async/staleness_max") or 0) for r in steps), default=0)),
        wasted=int(total("async/wasted_rollouts") + sum(float(r.get("async/wasted_rollouts") or 0) for r in final)),
        signal_share=(groups - silent) / groups if groups else 0.0,
        failure_rate=total("rollouts/failed") / total("rollouts/total") if total("rollouts/total") else 0.0,
        reached_step=reached_step,
        reached_s=reached_s,
        final_reward=sum(tail) / len(tail),
        returncode=rc,
    )


def run_mode(mode: str, out: Path, args: argparse.Namespace, extra: list[str], workload: str = "independent") -> ModeResult:
    run_dir = out / workload / mode
    correlated = [f"+task.generator_kwargs.long_tail_fail_slowdown={args.slowdown}"] if workload == "correlated" else []
    cmd = [
        sys.executable,
        "-m",
        "core.train",
        f"run_dir={run_dir}",
        f"seed={args.seed}",
        f"trainer.max_steps={args.steps}",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.loggers=[jsonl]",
        "trainer.max_concurrent_rollouts=1024",
        f"+task.generator_kwargs.long_tail_p50_s={args.p50}",
        f"+task.generator_kwargs.long_tail_ratio={args.ratio}",
        *correlated,
        *mode_overrides(mode),
        *extra,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
    records = read_metrics(run_dir / "metrics.jsonl")
    result = summarise(mode, records, target=args.target, window=args.window, rc=proc.returncode, workload=workload)
    print(f"{workload} {mode}: {result.steps} steps in {result.wall_s:.1f}s ({time.perf_counter() - t0:.0f}s with start-up)", file=sys.stderr)
    return result


def table(results: list[ModeResult], target: float) -> str:
    head = (
        f"{'workload':<11} {'mode':<8} {'steps/s':>8} {'rollouts/s':>10} {'trainer idle':>12} {'sampler idle':>12} "
        f"{'stale mean/max':>14} {'wasted':>6} {'signal':>6} {'failed':>6} "
        f"{f'to {target:g} (step, s)':>20} {'final reward':>12}"
    )
    lines = [head]
    for r in results:
        reached = f"{r.reached_step}, {r.reached_s:.1f}" if r.reached_step is not None else "not reached"
        lines.append(
            f"{r.workload:<11} {r.mode:<8} {r.steps_per_s:>8.2f} {r.rollouts_per_s:>10.0f} {r.trainer_idle:>12.0%} "
            f"{r.sampler_idle:>12.0%} {f'{r.staleness_mean:.2f}/{r.staleness_max}':>14} {r.wasted:>6} "
            f"{r.signal_share:>6.0%} {r.failure_rate:>6.0%} {reached:>20} {r.final_reward:>12.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["sync", "async0", "async1"])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--p50", type=float, default=0.3, help="median per-rollout delay, seconds (default 0.3)")
    parser.add_argument("--ratio", type=float, default=10.0, help="p99/p50 of the delay (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workloads", nargs="+", default=["independent", "correlated"], choices=["independent", "correlated"]
    )
    parser.add_argument(
        "--slowdown", type=float, default=5.0, help="correlated: a failing rollout's delay factor (default 5)"
    )
    parser.add_argument("--target", type=float, default=0.8, help="mean reward to reach (default 0.8)")
    parser.add_argument("--window", type=int, default=10, help="trailing window of the reward (default 10)")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    args = parser.parse_args(argv)
    for mode in args.modes:
        mode_overrides(mode)  # refuse a typo before the first run
    out = args.out or Path(tempfile.mkdtemp(prefix="tracerl-async-bench-"))
    print(f"runs in {out}; long tail p50 {args.p50}s, p99/p50 {args.ratio}", file=sys.stderr)
    results = [run_mode(mode, out, args, extra, workload) for workload in args.workloads for mode in args.modes]
    print(table(results, args.target))
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

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
    python benchmarks/async_loop.py --seeds 0 1 2 --modes sync async1 --out runs/   # the issue #28 targets
    python benchmarks/async_loop.py --seeds 0 1 2 --modes sync async1 --out runs/ --reuse   # table only

Workloads: ``independent`` (the delay does not depend on the answer) and
``correlated`` (``+task.generator_kwargs.long_tail_fail_slowdown=--slowdown``: a
rollout whose reply is wrong waits that many times longer, as an agent whose
failures loop to the turn cap); each runs every mode with the same seed, and the
table prints them side by side, with wasted rollouts (dropped by a step, or still
running or untrained when the run ended), the share of trained groups with a
nonzero advantage, and the failure rate the guard saw beside the true one (every
rollout that finished, trained or not).

Modes: ``sync`` (trainer.mode=sync), ``asyncK`` (trainer.mode=async,
trainer.max_staleness=K). Wall times are the loop's own (``time/train_wall``:
no imports, model build or agent start-up). Exit status 0 when every run finished.

``--seeds`` runs every workload x mode once per seed; below the per-run table a
summary gives each workload x mode the median over seeds, and each async mode
its ratios to ``sync`` and a verdict on issue #28's targets: time to the target
reward at most 0.4x sync's, final reward at least sync's minus 0.01, at most 2%
of finished rollouts wasted, and on ``correlated`` a signal share within 10%
(relative) of sync's and a failure rate seen by the guard equal to the true
one. ``--jobs N`` runs up to N runs at once (their wall times then share the
CPU: use it only for runs that mostly wait, such as ``sync`` on a long tail);
``--reuse`` keeps a run whose ``metrics.jsonl`` is complete, so a matrix can be
measured in parts into one ``--out`` and tabled at the end.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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
    seed: int
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
    true_failure_rate: float
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


@dataclass(frozen=True)
class RunKey:
    """Which run: workload, mode and seed."""

    workload: str
    mode: str
    seed: int = 0


def summarise(key: RunKey, records: list[dict[str, Any]], *, target: float, window: int, rc: int) -> ModeResult:
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
    wasted = int(total("async/wasted_rollouts") + sum(float(r.get("async/wasted_rollouts") or 0) for r in final))
    # The true failure rate counts every rollout that finished, trained or not: the
    # steps' rollouts/* count the finished untrained ones, a step's wasted ones are
    # added here. Rollouts cancelled at the run's end (the final record) never finished.
    dropped = total("async/wasted_rollouts")
    dropped_failed = sum(
        float(v or 0) for r in steps for k, v in r.items() if k.startswith("async/wasted/") and k != "async/wasted/ok"
    )
    seen = total("rollouts/total")
    return ModeResult(
        mode=key.mode,
        workload=key.workload,
        seed=key.seed,
        steps=len(steps),
        wall_s=wall,
        steps_per_s=len(steps) / wall if wall > 0 else 0.0,
        rollouts_per_s=total("rollouts/finished") / wall if wall > 0 else 0.0,
        trainer_idle=total("time/trainer_idle") / wall if wall > 0 else 0.0,
        sampler_idle=total("time/sampler_idle") / wall if wall > 0 else 0.0,
        staleness_mean=sum(ages) / len(ages) if ages else 0.0,
        staleness_max=int(max((float(r.get("async/staleness_max") or 0) for r in steps), default=0)),
        wasted=wasted,
        signal_share=(groups - silent) / groups if groups else 0.0,
        failure_rate=total("rollouts/failed") / seen if seen else 0.0,
        true_failure_rate=(total("rollouts/failed") + dropped_failed) / (seen + dropped) if seen + dropped else 0.0,
        reached_step=reached_step,
        reached_s=reached_s,
        final_reward=sum(tail) / len(tail),
        returncode=rc,
    )


def run_dir_of(out: Path, key: RunKey) -> Path:
    return out / key.workload / f"{key.mode}-seed{key.seed}"


def is_complete(run_dir: Path) -> bool:
    """A finished run's ``metrics.jsonl`` ends with its ``time/train_wall`` record."""
    path = run_dir / "metrics.jsonl"
    return path.exists() and any("time/train_wall" in r for r in read_metrics(path))


def run_mode(key: RunKey, out: Path, args: argparse.Namespace, extra: list[str]) -> ModeResult:
    run_dir = run_dir_of(out, key)
    if args.reuse and is_complete(run_dir):
        print(f"{key.workload} {key.mode} seed {key.seed}: kept from {run_dir}", file=sys.stderr)
        records = read_metrics(run_dir / "metrics.jsonl")
        return summarise(key, records, target=args.target, window=args.window, rc=0)
    correlated = [f"+task.generator_kwargs.long_tail_fail_slowdown={args.slowdown}"] if key.workload == "correlated" else []
    cmd = [
        sys.executable,
        "-m",
        "core.train",
        f"run_dir={run_dir}",
        f"seed={key.seed}",
        f"trainer.max_steps={args.steps}",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.loggers=[jsonl]",
        "trainer.max_concurrent_rollouts=1024",
        f"+task.generator_kwargs.long_tail_p50_s={args.p50}",
        f"+task.generator_kwargs.long_tail_ratio={args.ratio}",
        *correlated,
        *mode_overrides(key.mode),
        *extra,
    ]
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a half-written run from an earlier attempt
    print(f"{key.workload} {key.mode} seed {key.seed}: running into {run_dir}", file=sys.stderr)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{key.workload} {key.mode} seed {key.seed}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
    records = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    result = summarise(key, records, target=args.target, window=args.window, rc=proc.returncode)
    print(
        f"{key.workload} {key.mode} seed {key.seed}: {result.steps} steps in {result.wall_s:.1f}s "
        f"({time.perf_counter() - t0:.0f}s with start-up)",
        file=sys.stderr,
    )
    return result


def table(results: list[ModeResult], target: float) -> str:
    head = (
        f"{'workload':<11} {'mode':<8} {'seed':>4} {'steps/s':>8} {'rollouts/s':>10} {'trainer idle':>12} "
        f"{'sampler idle':>12} {'stale mean/max':>14} {'wasted':>6} {'signal':>6} {'failed':>6} {'true':>6} "
        f"{f'to {target:g} (step, s)':>20} {'final reward':>12}"
    )
    lines = [head]
    for r in results:
        reached = f"{r.reached_step}, {r.reached_s:.1f}" if r.reached_step is not None else "not reached"
        lines.append(
            f"{r.workload:<11} {r.mode:<8} {r.seed:>4} {r.steps_per_s:>8.2f} {r.rollouts_per_s:>10.0f} "
            f"{r.trainer_idle:>12.0%} {r.sampler_idle:>12.0%} {f'{r.staleness_mean:.2f}/{r.staleness_max}':>14} "
            f"{r.wasted:>6} {r.signal_share:>6.0%} {r.failure_rate:>6.1%} {r.true_failure_rate:>6.1%} "
            f"{reached:>20} {r.final_reward:>12.3f}"
        )
    return "\n".join(lines)


@dataclass
class Verdict:
    """One async mode against ``sync`` on one workload, medians over paired seeds."""

    workload: str
    mode: str
    time_ratio: float | None
    reward_gap: float
    wasted_share: float
    signal_ratio: float
    guard_gap: float
    checks: dict[str, bool]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def verdicts(results: list[ModeResult]) -> list[Verdict]:
    """Issue #28's targets for each async mode that has a ``sync`` run on its workload.

    Seeds are paired: the time ratio is the median over the seeds where both runs
    reached the target (a seed that reached it in neither mode has nothing to
    compare; one that reached it in only one mode fails the check), the reward gap
    the median of the seeds' differences.
    """
    out = []
    for workload in dict.fromkeys(r.workload for r in results):
        runs = [r for r in results if r.workload == workload]
        sync = {r.seed: r for r in runs if r.mode == "sync"}
        if not sync:
            continue
        for mode in dict.fromkeys(r.mode for r in runs if r.mode != "sync"):
            mine = {r.seed: r for r in runs if r.mode == mode and r.seed in sync}
            pairs = [(a, sync[seed]) for seed, a in mine.items()]
            both = [(a, b) for a, b in pairs if a.reached_s is not None and b.reached_s is not None]
            one = [(a, b) for a, b in pairs if (a.reached_s is None) != (b.reached_s is None)]
            ratios = [a.reached_s / b.reached_s for a, b in both if a.reached_s and b.reached_s]
            ratio = _median(ratios) if ratios and not one else None
            gap = _median([a.final_reward - b.final_reward for a, b in pairs])
            finished = sum(a.rollouts_per_s * a.wall_s for a, _ in pairs)
            wasted = sum(a.wasted for a, _ in pairs) / finished if finished else math.nan
            signal = _median([a.signal_share / b.signal_share for a, b in pairs if b.signal_share])
            guard = max((abs(a.failure_rate - a.true_failure_rate) for a, _ in pairs), default=math.nan)
            checks = {
                f"time <= 0.4x sync ({len(both)} of {len(pairs)} seeds reached it in both modes)": ratio is not None
                and ratio <= 0.4,
                "final >= sync - 0.01": gap >= -0.01,
                "wasted <= 2%": wasted <= 0.02,
            }
            if workload == "correlated":
                checks["signal within 10% of sync"] = abs(signal - 1.0) <= 0.10
                checks["guard sees the true failure rate"] = guard < 1e-9
            out.append(Verdict(workload, mode, ratio, gap, wasted, signal, guard, checks))
    return out


def summary(results: list[ModeResult], target: float) -> str:
    """Medians over seeds per workload x mode, then each async mode's ratios to sync and its verdicts."""
    lines = [
        f"{'workload':<11} {'mode':<8} {'seeds':>5} {f'to {target:g} s (median)':>20} "
        f"{'final (median)':>14} {'rollouts/s':>10} {'wasted':>6} {'signal':>6}"
    ]
    for workload in dict.fromkeys(r.workload for r in results):
        for mode in dict.fromkeys(r.mode for r in results if r.workload == workload):
            runs = [r for r in results if r.workload == workload and r.mode == mode]
            times = [r.reached_s for r in runs if r.reached_s is not None]
            reached = f"{_median(times):.1f}" if len(times) == len(runs) else f"{len(times)}/{len(runs)} reached"
            lines.append(
                f"{workload:<11} {mode:<8} {len(runs):>5} {reached:>20} "
                f"{_median([r.final_reward for r in runs]):>14.3f} {_median([r.rollouts_per_s for r in runs]):>10.0f} "
                f"{sum(r.wasted for r in runs):>6} {_median([r.signal_share for r in runs]):>6.0%}"
            )
    for v in verdicts(results):
        ratio = f"{v.time_ratio:.2f}x" if v.time_ratio is not None else "n/a"
        lines.append(
            f"{v.workload} {v.mode} vs sync: time to {target:g} {ratio}, final reward {v.reward_gap:+.3f}, "
            f"wasted {v.wasted_share:.1%}, signal share {v.signal_ratio:.2f}x, guard gap {v.guard_gap:.1%}"
        )
        for name, ok in v.checks.items():
            lines.append(f"  {'PASS' if ok else 'FAIL'}  {name}")
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
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed (default 0)")
    parser.add_argument(
        "--workloads", nargs="+", default=["independent", "correlated"], choices=["independent", "correlated"]
    )
    parser.add_argument(
        "--slowdown", type=float, default=5.0, help="correlated: a failing rollout's delay factor (default 5)"
    )
    parser.add_argument("--target", type=float, default=0.8, help="mean reward to reach (default 0.8)")
    parser.add_argument("--window", type=int, default=20, help="trailing window of the reward (default 20)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1; they share the CPU)")
    parser.add_argument("--reuse", action="store_true", help="keep runs already complete in --out")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    args = parser.parse_args(argv)
    for mode in args.modes:
        mode_overrides(mode)  # refuse a typo before the first run
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
    out = args.out or Path(tempfile.mkdtemp(prefix="tracerl-async-bench-"))
    print(f"runs in {out}; long tail p50 {args.p50}s, p99/p50 {args.ratio}", file=sys.stderr)
    keys = [RunKey(w, m, s) for w in args.workloads for m in args.modes for s in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda k: run_mode(k, out, args, extra), keys))
    print(table(results, args.target))
    print()
    print(summary(results, args.target))
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

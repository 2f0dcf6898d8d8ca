"""Does the embedded default learn for every seed? Runs ``python -m core.train`` per seed.

Each seed runs the default command in its own process (its own run directory
under ``--out``), and the table reports, per seed, the first step at which
the mean reward of the last ``--window`` steps reached ``--target``, the
final reward (mean of the last ``--window`` steps), and the wall time of the
whole process (imports and setup included). Extra arguments are passed to
every run as Hydra overrides, so a recipe change can be tried over seeds
before it becomes the default.

    python benchmarks/seeds.py                        # seeds 0..9, one at a time
    python benchmarks/seeds.py --jobs 2               # two processes at once (each 1 torch thread)
    python benchmarks/seeds.py --seeds 2 5 -- trainer.max_steps=400 algorithm.learning_rate=5e-4
    python benchmarks/seeds.py --jobs 2 --stop-after 10   # end each run 10 steps after it reached 0.8

With ``--stop-after K`` a run is ended K steps after it reached the target
(its final reward is then the trailing mean at that point, and ``steps`` says
where it stopped); a run that never reaches it still runs its whole budget.

Exit status 0 when every seed reached the target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class SeedResult:
    """One seed's run."""

    seed: int
    reached_step: int | None
    """First step whose trailing-window mean reward is >= the target; None if never."""
    final_reward: float
    """Mean reward of the last ``window`` steps."""
    steps: int
    wall_s: float
    returncode: int


def trailing_means(rewards: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each step (fewer at the start)."""
    out = []
    for i in range(len(rewards)):
        chunk = rewards[max(0, i + 1 - window) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def summarise(seed: int, rewards: list[float], *, target: float, window: int, wall_s: float, rc: int) -> SeedResult:
    """Reduce a run's per-step mean rewards to the table's row."""
    means = trailing_means(rewards, window)
    reached = next((i + 1 for i, m in enumerate(means) if m >= target and i + 1 >= window), None)
    final = means[-1] if means else math.nan
    return SeedResult(seed, reached, final, len(rewards), wall_s, rc)


def read_rewards(metrics: Path) -> list[float]:
    """Per-step ``reward/mean`` from a run's metrics.jsonl (eval-only records skipped)."""
    if not metrics.exists():
        return []
    rewards = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a run still writing
            break
        value = record.get("reward/mean")
        if value is not None:
            rewards.append(float(value))
    return rewards


def run_seed(
    seed: int, out: Path, overrides: list[str], *, target: float, window: int, stop_after: int | None = None
) -> SeedResult:
    run_dir = out / f"seed{seed}"
    cmd = [
        sys.executable, "-m", "core.train", f"seed={seed}", f"run_dir={run_dir}",
        "trainer.progress=false", "trainer.loggers=[jsonl]", *overrides,
    ]
    start = time.perf_counter()
    stop_at: int | None = None  # steps kept when the run was ended early
    with open(out / f"seed{seed}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(2.0)
            if stop_after is None:
                continue
            so_far = read_rewards(run_dir / "metrics.jsonl")
            reached = summarise(seed, so_far, target=target, window=window, wall_s=0, rc=0).reached_step
            if reached is not None and len(so_far) >= reached + stop_after:
                proc.terminate()  # the runtime's agent processes follow their parent
                proc.wait()
                stop_at = reached + stop_after
        rc = 0 if stop_at is not None else proc.returncode
    wall = time.perf_counter() - start
    rewards = read_rewards(run_dir / "metrics.jsonl")[:stop_at]
    return summarise(seed, rewards, target=target, window=window, wall_s=wall, rc=rc)


def table(results: list[SeedResult], target: float) -> str:
    lines = [f"{'seed':>4}  {'step >= ' + format(target, 'g'):>10}  {'final':>6}  {'steps':>5}  {'wall s':>7}"]
    for r in sorted(results, key=lambda r: r.seed):
        reached = str(r.reached_step) if r.reached_step is not None else "never"
        status = "" if r.returncode == 0 else f"  (exit {r.returncode})"
        lines.append(f"{r.seed:>4}  {reached:>10}  {r.final_reward:>6.3f}  {r.steps:>5}  {r.wall_s:>7.1f}{status}")
    ok = [r for r in results if r.reached_step is not None]
    lines.append(f"{len(ok)}/{len(results)} seeds reached {target:g}")
    if ok:
        steps = sorted(r.reached_step for r in ok if r.reached_step is not None)
        lines.append(
            f"steps to {target:g}: min {steps[0]}, median {steps[len(steps) // 2]}, max {steps[-1]}; "
            f"final reward min {min(r.final_reward for r in results):.3f}; "
            f"wall s per run: mean {sum(r.wall_s for r in results) / len(results):.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--window", type=int, default=5, help="steps in the trailing mean")
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument(
        "--stop-after", type=int, default=None, metavar="K",
        help="end a run K steps after it reached the target (default: run the whole budget)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="tracerl-seeds-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"runs and logs under {out}", flush=True)
    results: list[SeedResult] = []

    def one(seed: int) -> SeedResult:
        result = run_seed(
            seed, out, list(args.overrides), target=args.target, window=args.window, stop_after=args.stop_after
        )
        reached = result.reached_step if result.reached_step is not None else "never"
        print(f"seed {seed}: reached {reached}, final {result.final_reward:.3f}, {result.wall_s:.0f} s", flush=True)
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, args.seeds))
    print(table(results, args.target))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if all(r.reached_step is not None and r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

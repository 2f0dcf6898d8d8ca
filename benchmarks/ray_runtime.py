"""Benchmark of ``runtime=ray`` against ``runtime=local``: rollouts/s and per-rollout overhead.

Run from the repository root (needs the ``ray`` extra)::

    python benchmarks/ray_runtime.py                   # 64 and 256 concurrent sessions
    python benchmarks/ray_runtime.py --concurrency 64 --json out.json

The workload is ``benchmarks/local_runtime.py``'s (its ``Workload``): a trivial agent doing one chat
completion through the real gateway (scripted sampler, reward 1), so the figures
measure runtime plumbing, not a model. Both runtimes get two agent server
processes: ``runtime=local`` with ``num_processes=2``; ``runtime=ray`` with two
actors of one process each, on a private single-node Ray started here
(``--ray-cpus``). Per runtime and concurrency C:

- throughput: ``rounds * C`` rollouts, C in flight at a time;
- overhead: ``--sequential`` rollouts one at a time; the mean rollout latency
  as the runtime reports it (``elapsed_s``), and the ray minus local difference
  is what Ray's actor hop adds to every rollout.
"""

from __future__ import annotations

import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


async def _bench(kind: str, concurrency: int, rounds: int, sequential: int) -> dict[str, Any]:
    import asyncio
    import statistics
    import time

    from local_runtime import Workload

    from core.types import RolloutStatus

    async with Workload() as w:
        rt: Any
        if kind == "local":
            from core.runtime.local import LocalRuntime

            rt = LocalRuntime(w.AGENT, env=w.env, num_processes=2, max_concurrency=concurrency)
        else:
            from core.runtime.ray import RayRuntime

            rt = RayRuntime(
                w.AGENT,
                env=w.env,
                num_actors=2,
                agents_per_actor=(concurrency + 1) // 2,
                num_cpus_per_agent=0.001,
                gateway_host="127.0.0.1",
            )
        await rt.start()
        try:
            await asyncio.gather(*(w.one(rt) for _ in range(min(concurrency, 32))))  # warm up
            total = rounds * concurrency
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            results = await asyncio.gather(*(w.one(rt) for _ in range(total)))
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            ok = sum(r.status is RolloutStatus.OK for r in results)
            singles = [await w.one(rt) for _ in range(sequential)]
        finally:
            await rt.aclose()
    return {
        "runtime": kind,
        "concurrency": concurrency,
        "rollouts": total,
        "ok": ok,
        "wall_s": round(wall, 3),
        "rollouts_per_s": round(total / wall, 1),
        "mean_elapsed_ms": round(1000 * statistics.fmean(r.elapsed_s for r in results), 1),
        "driver_cpu_ms_per_rollout": round(1000 * cpu / total, 2),
        "sequential_ok": sum(r.status is RolloutStatus.OK for r in singles),
        "sequential_ms": round(1000 * statistics.fmean(r.elapsed_s for r in singles), 2),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import asyncio
    import json

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument(
        "--rounds", type=int, default=4, help="throughput rollouts = rounds * concurrency"
    )
    parser.add_argument("--sequential", type=int, default=50, help="rollouts one at a time")
    parser.add_argument("--ray-cpus", type=float, default=2.0, help="CPUs of the private Ray")
    parser.add_argument("--json", default="", help="also write the figures here")
    args = parser.parse_args(argv)
    sys.path.insert(0, HERE)  # the agent module (local_runtime:app) for the local pool's spawns

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=args.ray_cpus,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        logging_level="WARNING",
        log_to_driver=False,
    )
    try:
        rows = []
        for c in args.concurrency:
            for kind in ("local", "ray"):
                rows.append(asyncio.run(_bench(kind, c, args.rounds, args.sequential)))
    finally:
        ray.shutdown()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'C':>5} | {'local r/s':>9} {'ray r/s':>8} | {'local ms':>8} {'ray ms':>7} | "
        f"{'seq local ms':>12} {'seq ray ms':>10} {'added ms':>8} | {'drv CPU ms/r local':>18} {'ray':>5} | ok"
    )
    for c in args.concurrency:
        lo, ra = (next(r for r in rows if r["runtime"] == k and r["concurrency"] == c) for k in ("local", "ray"))
        print(
            f"{c:>5} | {lo['rollouts_per_s']:>9} {ra['rollouts_per_s']:>8} | "
            f"{lo['mean_elapsed_ms']:>8} {ra['mean_elapsed_ms']:>7} | "
            f"{lo['sequential_ms']:>12} {ra['sequential_ms']:>10} "
            f"{ra['sequential_ms'] - lo['sequential_ms']:>8.2f} | "
            f"{lo['driver_cpu_ms_per_rollout']:>18} {ra['driver_cpu_ms_per_rollout']:>5} | "
            f"{lo['ok']}/{lo['rollouts']} {ra['ok']}/{ra['rollouts']}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate every performance and time figure quoted in README.md and docs/, with the machine.

Run from the repository root::

    python benchmarks/figures.py                      # every figure but the expensive ones
    python benchmarks/figures.py --list               # names, commands, cost, where quoted
    python benchmarks/figures.py --only default_run,openai_client
    python benchmarks/figures.py --skip default_run   # the cheap ones only (about 7 minutes)
    python benchmarks/figures.py --json figures.json
    python benchmarks/figures.py --write-page        # docs/performance.md from benchmarks/results/

Each figure names the command or benchmark that produces it and the pages that
link to it, so a number can always be traced and re-measured. The measured
runs kept in ``benchmarks/results/*.json`` are what docs/performance.md shows;
``--write-page`` regenerates that page's generated part from them (no measuring),
and tests/meta/test_figures.py checks the committed page is what it writes. The
expensive ones (``seeds``: ten 400-step runs; ``test_suite``: the whole
``python -m pytest``; ``train_memory``: steps peaking near 10 GB) run only when
asked by name with ``--only``. Figures are
wall-clock and CPU times, so they depend on the machine and on what else runs
on it: the header prints the CPU, the cores this process may use, memory and
the load average before and after, and docs/performance.md shows them beside
every value.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # this checkout's core, and seeds.py


@dataclass
class Figure:
    """One figure: how to produce it and where it is quoted."""

    name: str
    command: str
    """What a reader runs to reproduce it by hand."""
    quoted_in: list[str]
    """Repository files that link to it (docs/performance.md#<name>)."""
    cost: str
    """Rough wall time on the 2-core development machine."""
    run: Callable[[Path], dict[str, Any]]
    expensive: bool = False
    """Run only when named with ``--only``."""
    notes: list[str] = field(default_factory=list)


def _env(**extra: str) -> dict[str, str]:
    """This checkout's ``core`` first (the script may run from a worktree), plus ``extra``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def _python(
    args: list[str], out: Path, name: str, timeout_s: float = 3600, env: dict[str, str] | None = None
) -> tuple[int, float, str]:
    """Run ``python <args>`` from the repository root; returns (exit code, wall s, output)."""
    log = out / f"{name}.log"
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env or _env(), stdout=fh, stderr=subprocess.STDOUT,
            timeout=timeout_s, check=False,
        )
    return proc.returncode, time.perf_counter() - start, log.read_text()


def _records(metrics: Path) -> list[dict[str, Any]]:
    out = []
    for line in metrics.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


# -- figures ---------------------------------------------------------------------------


def default_run(out: Path) -> dict[str, Any]:
    """The README's main command, seed 0, its whole 400-step budget, timed from process start."""
    from seeds import trailing_means

    run_dir = out / "default_run"
    start = time.perf_counter()
    seen: dict[int, float] = {}  # step -> seconds since start when its record appeared
    with (out / "default_run.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "core.train", f"run_dir={run_dir}"],
            cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT,
        )
        while proc.poll() is None:
            time.sleep(0.5)
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists():
                now = time.perf_counter() - start
                for r in _records(metrics):
                    if "reward/mean" in r and r["step"] not in seen:
                        seen[r["step"]] = now
    wall = time.perf_counter() - start
    records = [r for r in _records(run_dir / "metrics.jsonl") if "reward/mean" in r]
    rewards = [float(r["reward/mean"]) for r in records]
    means = trailing_means(rewards, 5)
    reached = next((i + 1 for i, m in enumerate(means) if m >= 0.8 and i + 1 >= 5), None)
    above_09 = next(
        (i + 1 for i in range(len(means)) if all(m >= 0.9 for m in means[i:])), None
    )
    step_times = [float(r["time/step"]) for r in records]
    return {
        "exit_code": proc.returncode,
        "steps": len(rewards),
        "reward_step_1": round(rewards[0], 3) if rewards else None,
        "step_reaching_0.8 (trailing 5-step mean)": reached,
        "seconds_into_run_at_that_step": round(seen.get(reached, float("nan")), 1) if reached else None,
        "trailing_mean_stays_above_0.9_from_step": above_09,
        "final_reward (trailing 5-step mean)": round(means[-1], 3) if means else None,
        "mean_s_per_step": round(sum(step_times) / len(step_times), 3) if step_times else None,
        "median_s_per_step": round(sorted(step_times)[len(step_times) // 2], 3) if step_times else None,
        "wall_s (imports, eval, checkpoints included)": round(wall, 1),
    }


def openai_client(out: Path) -> dict[str, Any]:
    """What an agent pays per model call for a new ``AsyncOpenAI`` versus a per-session view."""
    from openai import AsyncOpenAI

    async def measure() -> dict[str, Any]:
        warm = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
        await warm.close()  # imports and certificate loading are paid once, not per call
        n = 20
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
            await client.close()
        new_ms = (time.perf_counter() - wall) / n * 1000
        new_cpu_ms = (time.process_time() - cpu) / n * 1000
        pool = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
        m = 2000
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(m):
            pool.with_options(api_key=f"session-{i}")
        view_us = (time.perf_counter() - wall) / m * 1e6
        view_cpu_us = (time.process_time() - cpu) / m * 1e6
        await pool.close()
        return {
            "new_client_ms": round(new_ms, 1),
            "new_client_cpu_ms": round(new_cpu_ms, 1),
            "with_options_us": round(view_us, 1),
            "with_options_cpu_us": round(view_cpu_us, 1),
        }

    return asyncio.run(measure())


def _train_steps(args: list[str], out: Path, name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run_dir = out / name
    code, wall, log = _python(["-m", "core.train", *args, f"run_dir={run_dir}"], out, name, env=env)
    records = _records(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    steps = [r for r in records if "time/step" in r]
    return {
        "exit_code": code,
        "steps": len(steps),
        "s_per_step": [round(float(r["time/step"]), 2) for r in steps],
        "rollouts_failed": sum(int(r.get("rollouts/failed", 0)) for r in steps),
        "wall_s": round(wall, 1),
        **({"log_tail": log[-1500:]} if code else {}),
    }


def examples(out: Path) -> dict[str, Any]:
    """The documented example commands (examples/README.md), 3 steps each."""
    return {
        task: _train_steps([f"task={task}", "trainer.max_steps=3"], out, f"example_{task}")
        for task in ("math_agent", "strands_math_agent")
    }


def standin_step(out: Path) -> dict[str, Any]:
    """docs/agentcore.md's stand-in recipe: stand-in + the printed training command, 3 steps."""
    import socket

    from core.testing.agentcore_standin.__main__ import STANDIN_BATCH

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    standin = subprocess.Popen(
        [sys.executable, "-m", "core.testing.agentcore_standin", "core.tasks.succ_digit:app", "--port", str(port)],
        cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=(out / "standin.log").open("w"),
    )
    try:
        time.sleep(3.0)
        from core.testing.agentcore_standin import EXAMPLE_ARN
        from core.testing.agentcore_standin.__main__ import STANDIN_CREDENTIALS

        credentials = dict(pair.split("=", 1) for pair in STANDIN_CREDENTIALS.split())

        args = [
            "runtime=agentcore", f"runtime.endpoint_url={url}", f"runtime.agent_runtime_arn={EXAMPLE_ARN}",
            "runtime.result_channel=http", *STANDIN_BATCH.split(), "trainer.max_steps=3",
        ]
        result = _train_steps(args, out, "standin", env=_env(**credentials))
        children = subprocess.run(
            ["pgrep", "-P", str(standin.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        result["agent_processes_alive_after_run"] = len(children)
        return result
    finally:
        standin.terminate()
        standin.wait(30)


def _benchmark_json(args: list[str], out: Path, name: str) -> tuple[int, float, Any]:
    target = out / f"{name}.json"
    code, wall, log = _python([*args, "--json", str(target)], out, name)
    data = json.loads(target.read_text()) if target.exists() else {"log_tail": log[-1500:]}
    return code, wall, data


def local_runtime(out: Path) -> dict[str, Any]:
    """benchmarks/local_runtime.py: rollouts/s and memory per in-flight session."""
    code, wall, rows = _benchmark_json(["benchmarks/local_runtime.py"], out, "local_runtime")
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def ray_runtime(out: Path) -> dict[str, Any]:
    """benchmarks/ray_runtime.py --rounds 6: runtime=ray against runtime=local (needs the ray extra)."""
    code, wall, rows = _benchmark_json(["benchmarks/ray_runtime.py", "--rounds", "6"], out, "ray_runtime")
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def gateway_append(out: Path) -> dict[str, Any]:
    """benchmarks/gateway.py's append workload on the tiny tokenizer (the 1k x 256-session row is the quoted one)."""
    code, wall, rows = _benchmark_json(
        ["benchmarks/gateway.py", "--workload", "append", "--tokenizer", "tiny"], out, "gateway_append"
    )
    keep = ("sessions", "context_tokens", "turns", "turns_per_s", "p50_ms", "p99_ms", "gateway_cpu_ms_per_turn")
    if isinstance(rows, list):
        rows = [{k: r.get(k) for k in keep} for r in rows]
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


GATEWAY_KEEP = (
    "workload", "sessions", "context_tokens", "body_kb", "turns", "turns_per_s", "p50_ms", "p99_ms",
    "added_p50_ms", "added_p99_ms", "gateway_cpu_ms_per_turn", "client_cpu_ms_per_turn", "gateway_rss_mb",
    "gateway_peak_rss_mb",
)


def _gateway(args: list[str], out: Path, name: str) -> dict[str, Any]:
    code, wall, rows = _benchmark_json(["benchmarks/gateway.py", *args], out, name)
    if isinstance(rows, list):
        rows = [{k: r[k] for k in GATEWAY_KEEP if k in r} for r in rows]
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def gateway_agent(out: Path) -> dict[str, Any]:
    """benchmarks/gateway.py's agent workload on Qwen3's tokenizer (ChatML template): CPU per turn,
    body size and RSS at 1 and 256 sessions of ~1k tokens and one session at ~8k and ~32k."""
    return _gateway(["--workload", "agent", "--grid", "1x1000,256x1000,1x8000,1x32000"], out, "gateway_agent")


def gateway_tools(out: Path) -> dict[str, Any]:
    """benchmarks/gateway.py's tool-using agent workload on Qwen3's tokenizer (a tool call and a
    128-token tool result appended every turn)."""
    return _gateway(["--workload", "tools"], out, "gateway_tools")


def gateway_ramp(out: Path) -> dict[str, Any]:
    """benchmarks/gateway.py's concurrency ramp (1 to 2,000 sessions of ~1k tokens in flight) with the
    sampler sleeping 0.02-0.5 s a turn (the 0.2-5 s ramp, ten times faster): turns/s, the latency
    the gateway added (p50/p99), gateway and load-generator CPU per turn. One gateway process."""
    return _gateway(["--workload", "ramp", "--quick", "--ramp-delay", "0.02:0.5"], out, "gateway_ramp")


def gateway_peer(out: Path) -> dict[str, Any]:
    """benchmarks/gateway_peer.py: gateway CPU per turn beside agentcore-rl-toolkit 0.2.0's gateway
    (linear and tree history) on Qwen3's tokenizer, and tracerl before issue #32's work, 3 runs."""
    code, wall, data = _benchmark_json(["benchmarks/gateway_peer.py", *PEER_ARGS], out, "gateway_peer")
    keys = ["workload", "context_mean", "context_last"]
    keys += [f"{gw}-{mode}_cpu_ms" for gw in ("peer", "tracerl", "before") for mode in ("linear", "tree")]
    keys += [f"{gw}_over_tracerl_{mode}" for gw in ("peer", "before") for mode in ("linear", "tree")]
    rows = [{k: (round(row[k], 3) if isinstance(row[k], float) else row[k]) for k in keys if k in row}
            for row in data.get("summary", [])]
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows or data}


PEER_ARGS = ["--before", "a21f9ea^"]
"""``benchmarks/gateway_peer.py``'s ``BEFORE_32``: tracerl before issue #32's gateway work."""


def gateway_shards(out: Path) -> dict[str, Any]:
    """benchmarks/gateway_shards.py: 256 sessions of ~1k tokens against one gateway process and
    against two shards (``gateway.shards``): turns/s, latency p50/p99, gateway CPU per turn."""
    code, wall, rows = _benchmark_json(["benchmarks/gateway_shards.py"], out, "gateway_shards")
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def gateway_shards_ramp(out: Path) -> dict[str, Any]:
    """benchmarks/gateway_shards.py's concurrency ramp on Qwen3's tokenizer: 10 to 2,000 sessions
    of ~1k tokens in flight, the sampler sleeping 0.2-5 s a turn (log-uniform, each session its
    own), one shard against two:
    turns/s, the latency the shards added (p50/p99), gateway CPU per turn, each shard's peak memory."""
    code, wall, rows = _benchmark_json(
        ["benchmarks/gateway_shards.py", *SHARDS_RAMP_ARGS], out, "gateway_shards_ramp"
    )
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


SHARDS_RAMP_ARGS = [
    "--tokenizer", "qwen3", "--shards", "1,2", "--sessions", "10,100,500,1000,2000", "--delay", "0.2:5", "--turns", "2",
]


def local_sampler(out: Path) -> dict[str, Any]:
    """benchmarks/local_sampler.py: batched vs sequential decoding of the tiny model (2 threads)."""
    code, wall, rows = _benchmark_json(["benchmarks/local_sampler.py"], out, "local_sampler")
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def train_memory(out: Path) -> dict[str, Any]:
    """benchmarks/train_memory.py: peak memory of one local training step (151,936-token vocabulary,
    tiny body), whole-micro-batch logits (chunk 0) against logits made ``chunk`` tokens at a time."""
    code, wall, rows = _benchmark_json(["benchmarks/train_memory.py"], out, "train_memory")
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def traces(out: Path) -> dict[str, Any]:
    """benchmarks/traces.py: trace size and write time of a toy step; a large step's encoding
    CPU and how long it stalls the event loop, written on it or from the worker thread."""
    code, wall, data = _benchmark_json(["benchmarks/traces.py"], out, "traces")
    return {"exit_code": code, "wall_s": round(wall, 1), **(data if isinstance(data, dict) else {"data": data})}


def _pytest_cpu(args: list[str], out: Path, name: str) -> tuple[int, float, float, str]:
    """Run ``python -m pytest <args>``: (exit code, wall s, CPU s of the run and its children, output)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, wall, log = _python(["-m", "pytest", "-p", "no:cacheprovider", *args], out, name)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu, log


def frameworks_tests(out: Path) -> dict[str, Any]:
    """``python -m pytest -m frameworks`` (README's test section): its CPU time, imports included."""
    code, wall, cpu, log = _pytest_cpu(["-q", "-m", "frameworks"], out, "frameworks_tests")
    summary = [ln for ln in log.splitlines() if re.search(r"\d+ passed", ln)]
    return {"exit_code": code, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "summary": summary[-1:] or log[-500:]}


def stored_response_memory(out: Path) -> dict[str, Any]:
    """A stored Response's logprobs kept compactly vs as per-token dicts (docs/gateway.md), as
    tests/gateway/test_session_memory.py measures and prints it."""
    code, wall, _, log = _pytest_cpu(
        ["-q", "-s", "tests/gateway/test_session_memory.py", "-k", "fraction_of_the_dicts"], out, "stored_response_memory"
    )
    found = re.search(r"stored response memory: (\d+) tokens, (\d+) kB kept, (\d+) kB as dicts", log)
    if found is None:
        return {"exit_code": code or 1, "log_tail": log[-1500:]}
    tokens, kept, dicts = (int(g) for g in found.groups())
    return {"exit_code": code, "wall_s": round(wall, 1), "tokens": tokens, "kept_kB": kept, "as_dicts_kB": dicts}


def seeds(out: Path) -> dict[str, Any]:
    """benchmarks/seeds.py over seeds 0..9 (the quickstart's table)."""
    code, wall, rows = _benchmark_json(
        ["benchmarks/seeds.py", "--jobs", "2", "--stop-after", "10", "--out", str(out / "seeds")], out, "seeds"
    )
    return {"exit_code": code, "wall_s": round(wall, 1), "rows": rows}


def test_suite(out: Path) -> dict[str, Any]:
    """README's test command, ``python -m pytest -n auto --dist loadfile`` (its test-time figure)."""
    code, wall, log = _python(
        ["-m", "pytest", "-n", "auto", "--dist", "loadfile", "-q", "-p", "no:cacheprovider"], out, "test_suite"
    )
    summary = [ln for ln in log.splitlines() if re.search(r"\d+ passed", ln)]
    return {"exit_code": code, "wall_s": round(wall, 1), "summary": summary[-1:] or log[-500:]}


FIGURES = [
    Figure(
        "default_run", "python -m core.train", ["README.md", "docs/quickstart.md", "docs/backends/local.md"],
        "3-5 min", default_run,
    ),
    Figure(
        "openai_client", "AsyncOpenAI(...) per call vs .with_options(api_key=...) per session",
        ["docs/quickstart.md", "docs/runtime.md", "examples/README.md", "examples/math_agent/client.py"], "2 s",
        openai_client,
    ),
    Figure(
        "examples", "python -m core.train task=math_agent|strands_math_agent trainer.max_steps=3",
        ["examples/README.md"], "40 s", examples,
    ),
    Figure(
        "standin_step", "python -m core.testing.agentcore_standin core.tasks.succ_digit:app + the printed command",
        ["docs/agentcore.md"], "40 s", standin_step,
    ),
    Figure("local_runtime", "python benchmarks/local_runtime.py", ["docs/runtime.md"], "1 min", local_runtime),
    Figure(
        "ray_runtime", "python benchmarks/ray_runtime.py --rounds 6", ["docs/runtime.md"], "2-3 min", ray_runtime,
    ),
    Figure(
        "gateway_append", "python benchmarks/gateway.py --workload append --tokenizer tiny", ["docs/gateway.md"],
        "1-2 min", gateway_append,
    ),
    Figure(
        "gateway_agent", "python benchmarks/gateway.py --workload agent --grid 1x1000,256x1000,1x8000,1x32000",
        ["docs/gateway.md"], "2-4 min", gateway_agent,
    ),
    Figure("gateway_tools", "python benchmarks/gateway.py --workload tools", ["docs/gateway.md"], "2-4 min",
           gateway_tools),
    Figure(
        "gateway_ramp", "python benchmarks/gateway.py --workload ramp --quick --ramp-delay 0.02:0.5",
        ["docs/gateway.md"], "2-4 min", gateway_ramp,
    ),
    Figure(
        "gateway_peer", "python benchmarks/gateway_peer.py " + " ".join(PEER_ARGS),
        ["docs/gateway.md"], "2 min", gateway_peer,
    ),
    Figure("gateway_shards", "python benchmarks/gateway_shards.py", ["docs/scale.md"], "3 min", gateway_shards),
    Figure(
        "gateway_shards_ramp", "python benchmarks/gateway_shards.py " + " ".join(SHARDS_RAMP_ARGS),
        ["docs/scale.md"], "4 min", gateway_shards_ramp,
    ),
    Figure("local_sampler", "python benchmarks/local_sampler.py", ["docs/backends/local.md"], "30 s", local_sampler),
    Figure("traces", "python benchmarks/traces.py", ["docs/viewer.md"], "30-60 s", traces),
    Figure(
        "train_memory", "python benchmarks/train_memory.py", ["docs/backends/local.md", "docs/real_models.md"],
        "10-20 min", train_memory, expensive=True,
    ),
    Figure(
        "stored_response_memory", "python -m pytest -s tests/gateway/test_session_memory.py -k fraction_of_the_dicts",
        ["docs/gateway.md"], "15 s", stored_response_memory,
    ),
    Figure("frameworks_tests", "python -m pytest -m frameworks", ["README.md"], "30-60 s", frameworks_tests),
    Figure(
        "seeds", "python benchmarks/seeds.py --jobs 2 --stop-after 10", ["docs/quickstart.md"],
        "15-25 min", seeds, expensive=True,
    ),
    Figure(
        "test_suite", "python -m pytest -n auto --dist loadfile", ["README.md", "docs/architecture.md"], "10-15 min",
        test_suite, expensive=True,
    ),
]


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines()
                           if ln.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    try:  # the installed version, without the seconds an import of torch takes
        from importlib.metadata import PackageNotFoundError, version

        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    changed = subprocess.run(  # a measurement of uncommitted code names the commit it started from
        ["git", "status", "--porcelain", "--", "core", "plugins", "benchmarks/*.py"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout.strip()
    if commit and changed:
        commit += "+changes"
    return {
        "cpu": cpu,
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch_version,
        "commit": commit,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


# -- docs/performance.md ------------------------------------------------------------------

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
BEGIN = "<!-- generated by python benchmarks/figures.py --write-page: edit benchmarks/results/, not this part -->"
END = "<!-- end of the generated part -->"


def _cell(value: Any) -> str:
    """A value as table text: floats to 3 significant digits, lists joined."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list) and not any(isinstance(v, dict) for v in value):
        return ", ".join(_cell(v) for v in value)
    if value is None:
        return "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flat(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested results as (key path, value) pairs; lists of rows stay whole."""
    out: list[tuple[str, Any]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key} / ")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _rows_table(rows: list[dict[str, Any]]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---:|" * len(keys)]
    lines += ["| " + " | ".join(_cell(r.get(k)) for k in keys) + " |" for r in rows]
    return lines


def _measured_on(name: str, m: dict[str, Any]) -> str:
    load = _cell(m.get("load_average_1_5_15", ["?"])[0])
    after = _cell(m.get("load_average_after", ["?"])[0])
    return (
        f"`{name}`: {m.get('date_utc', '?')} UTC, commit {m.get('commit', '?')}, "
        f"load average {load} before, {after} after"
    )


def performance_page_part(results: Path = RESULTS) -> str:
    """The generated part of docs/performance.md, from the runs kept under ``results``."""
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
    lines = [
        BEGIN,
        "",
        "## Measured by `benchmarks/figures.py`",
        "",
        "Each run below is one `python benchmarks/figures.py --json ...` kept in `benchmarks/results/`.",
        "",
        "| run | date (UTC) | commit | CPU | cores | memory GiB | Python | torch | load average before (1/5/15 min) | after |",
        "|---|---|---|---|---:|---:|---|---|---|---|",
    ]
    for name, run in runs.items():
        m = run["machine"]
        lines.append(
            f"| `{name}` | {m.get('date_utc')} | {m.get('commit')} | {m.get('cpu')} | {m.get('cores_usable')} "
            f"| {m.get('memory_gib')} | {m.get('python')} | {m.get('torch')} "
            f"| {_cell(m.get('load_average_1_5_15'))} | {_cell(m.get('load_average_after'))} |"
        )
    for figure in FIGURES:
        lines += ["", f"### {figure.name}", "", (inspect.getdoc(figure.run) or "").replace("\n", " "), ""]
        lines += [
            f"- measures: `{figure.command}`",
            f"- re-measure: `python benchmarks/figures.py --only {figure.name}` (about {figure.cost} here)",
            "- linked from: " + ", ".join(f"`{page}`" for page in figure.quoted_in),
        ]
        measured = [(name, run) for name, run in runs.items() if figure.name in run["figures"]]
        if not measured:
            lines += ["", "No kept run has measured it yet; see [Recorded by hand](#recorded-by-hand)."]
            continue
        values = {name: dict(run["figures"][figure.name]["values"]) for name, run in measured}
        rows = {name: v.pop("rows", None) for name, v in values.items()}
        pairs = {name: dict(_flat(v)) for name, v in values.items()}
        keys = list(dict.fromkeys(k for p in pairs.values() for k in p))
        if keys:
            lines += ["", "| value | " + " | ".join(f"`{name}`" for name, _ in measured) + " |"]
            lines += ["|---|" + "---:|" * len(measured)]
            lines += [f"| {k} | " + " | ".join(_cell(pairs[name].get(k)) for name, _ in measured) + " |" for k in keys]
        for name, run in measured:
            if isinstance(rows[name], list) and rows[name]:
                lines += ["", _measured_on(name, run["machine"]) + ":", ""] + _rows_table(rows[name])
    lines += ["", END]
    return "\n".join(lines) + "\n"


def write_page(page: Path = PAGE, results: Path = RESULTS) -> bool:
    """Replace the generated part of ``page``; returns whether the text changed."""
    text = page.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END) + 1
    new = text[:start] + performance_page_part(results) + text[end:]
    if new != text:
        page.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated figure names (expensive ones included)")
    parser.add_argument("--skip", default="", help="comma-separated figure names to leave out")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    parser.add_argument("--json", type=Path, default=None, help="also write everything here")
    parser.add_argument("--out", type=Path, default=None, help="logs and run directories (default: temp)")
    parser.add_argument(
        "--write-page", action="store_true", help="regenerate docs/performance.md from benchmarks/results/ and exit"
    )
    args = parser.parse_args(argv)
    if args.write_page:
        print(f"{PAGE.relative_to(ROOT)}: {'rewritten' if write_page() else 'unchanged'}")
        return 0
    names = {f.name for f in FIGURES}
    only = [n for n in args.only.split(",") if n]
    skip = [n for n in args.skip.split(",") if n]
    unknown = sorted(set(only + skip) - names)
    if unknown:
        parser.error(f"unknown figure(s) {unknown}; known: {sorted(names)}")
    if args.list:
        for f in FIGURES:
            flag = "  (expensive: --only)" if f.expensive else ""
            print(f"{f.name:<15} {f.cost:>10}  {f.command}{flag}\n{'':<27}quoted in {', '.join(f.quoted_in)}")
        return 0
    chosen = [f for f in FIGURES if (f.name in only if only else not f.expensive) and f.name not in skip]
    out = args.out or Path(tempfile.mkdtemp(prefix="tracerl-figures-"))
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine(), "figures": {}}
    print(f"machine: {json.dumps(report['machine'])}", flush=True)
    print(f"logs under {out}", flush=True)
    failed = False
    for f in chosen:
        print(f"\n== {f.name}: {f.command}  (quoted in {', '.join(f.quoted_in)})", flush=True)
        start = time.perf_counter()
        try:
            values = f.run(out)
        except Exception as exc:  # one broken figure must not hide the others
            values = {"error": f"{type(exc).__name__}: {exc}"}
        values["measured_in_s"] = round(time.perf_counter() - start, 1)
        failed |= "error" in values or bool(values.get("exit_code"))
        report["figures"][f.name] = {"command": f.command, "quoted_in": f.quoted_in, "values": values}
        print(json.dumps(values, indent=1), flush=True)
    report["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average after: {report['machine']['load_average_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

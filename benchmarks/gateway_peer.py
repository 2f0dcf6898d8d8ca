"""Gateway CPU per turn, tracerl beside agentcore-rl-toolkit's RolloutGateway (the peer), same workload.

    python benchmarks/gateway_peer.py                  # four workloads, both gateways, linear and tree, 3 runs
    python benchmarks/gateway_peer.py --quick          # a smoke run: few turns, one run
    python benchmarks/gateway_peer.py --runs 5 --json /tmp/peer.json

Four gateway processes serve at once (six with ``--before``): ``python -m core.gateway``
(scripted sampler, through ``benchmarks/gateway.py``'s ``Gw``) and
``benchmarks/peer_gateway.py`` (``RolloutGateway`` 0.2.0, a zero-latency backend answering
the same reply tokens), each in ``--history-mode linear`` and ``tree``; ``--before
DIR_OR_COMMIT`` adds tracerl's gateway from another checkout or commit (``BEFORE_32``: before
issue #32's work), in both modes. Both render Qwen3's tokenizer with the ChatML
template (``benchmarks/gateway.py``'s ``tokenizer_source("qwen3")``). This process drives
them over HTTP with ``benchmarks/loadgen.py``'s aiohttp client, one connection pool per
gateway.

The workload is ``benchmarks/gateway.py``'s ``agent`` one (``AgentTexts``): a 256-token
system message, 128-token user turns, 33-token replies, every request resending the
whole history. Each session's first request (the one full render) is a warm-up and not
measured. The four workloads, after the table in the issue:

- 1 session, 20 requests from a fresh start (system and one user turn; the first request
  is the warm-up, so 19 measured turns) to ~3.7k tokens;
- 64 sessions, and 256 sessions, seeded with ~1k tokens of history, 4 turns each;
- 1 session growing from a fresh start to 32k tokens (the turns it takes: 179).

Measured per gateway, mode and workload: gateway CPU time per measured turn (user and
system CPU of the whole gateway process, every thread, from ``/proc``; ``CpuMeter``) and
the client-observed p50 latency. Runs are interleaved: each run goes through every
workload, and within a workload the four gateways take turns in an order rotated from one
workload and run to the next; the table gives medians over ``--runs`` runs and the ratio
peer/tracerl of those medians. Event loops are as shipped: tracerl's uvloop (when
installed), the peer's asyncio (``--peer-loop uvloop`` to give it uvloop too).

Checked at the end of every scenario: every reply came back 200 with the scripted text;
the four gateways got byte-identical request bodies (a digest of each session's bodies in
order) and reported the same prompt token counts turn by turn, growing every turn; the
first session's last prompt is as long as a local render of the whole history it was sent
(so each request really carried the whole history); and each session finished as one trace row holding
every turn (tokens = last prompt + reply, trained tokens = turns x reply). A failed check
is listed and marks its cell with ``!``; the exit status is then 1. An HTTP error or a
reply other than the scripted text stops the run there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gateway import (  # noqa: E402
    AgentTexts,
    Gw,
    _new_sessions,
    load_tokenizer,
    tokenizer_source,
)
from benchmarks.loadgen import LoadClient  # noqa: E402
from core.samplers.scripted import encode_reply  # noqa: E402

HERE = Path(__file__).resolve().parent
MODES = ("linear", "tree")
BEFORE_32 = "a21f9ea^"
"""The commit before issue #32's gateway work (the issue's table was measured there)."""
GATEWAYS = ("tracerl", "peer", "before")
"""tracerl at this checkout, the peer, and (``--before DIR_OR_COMMIT``) tracerl at another."""
ISSUE = {  # the issue's table: (peer linear, peer tree, tracerl linear, tracerl tree) CPU ms/turn
    "1x20": (3.64, 6.10, 1.66, 1.14),
    "64x1k": (2.52, 4.77, 0.91, 0.89),
    "256x1k": (2.02, 2.99, 1.01, 0.93),
    "1x32k": (8.02, 39.28, 5.37, 5.41),
}


def sides(before: bool) -> tuple[tuple[str, str], ...]:
    """(gateway, history mode) of each gateway process: four, or six with ``--before``."""
    return tuple((gw, mode) for gw in GATEWAYS[: 3 if before else 2] for mode in MODES)


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    sessions: int
    seed_context: int
    """``AgentTexts.history`` target of each session's first request (0: system and one user turn)."""
    turns: int
    """Measured turns per session, after the warm-up."""


class CpuMeter:
    """CPU seconds a process uses between ``start()`` and ``stop()``, threads that exit included.

    ``Gw.cpu`` sums ``/proc/<pid>/task/*/schedstat``, exact while a process's threads live
    as long as it does (tracerl's). The peer's tokenizer (``tokenizers``' ``async_encode``)
    runs on tokio's blocking pool, whose threads exit after 10 s idle, taking their CPU
    out of that sum (a delta went negative). Here each live thread's delta is taken from
    its own start value (0 for a thread born meanwhile), so a thread that exits idle costs
    nothing; and ``/proc/<pid>/stat`` (whole process, exited threads included, in clock
    ticks) is read too: where it exceeds the per-thread sum by more than two ticks (a
    thread exited after working in the interval), it is the figure.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = 1 / os.sysconf("SC_CLK_TCK")
        self._threads: dict[str, int] = {}
        self._stat = 0.0

    def _read(self) -> tuple[dict[str, int], float]:
        threads = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError), \
                    open(f"/proc/{self.pid}/task/{tid}/schedstat") as f:
                threads[tid] = int(f.read().split()[0])
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return threads, (int(fields[11]) + int(fields[12])) * self.tick

    def start(self) -> None:
        self._threads, self._stat = self._read()

    def stop(self) -> tuple[float, str]:
        """(CPU seconds since ``start``, which reading gave it: 'threads' or 'stat')."""
        threads, stat = self._read()
        per_thread = sum(ns - self._threads.get(tid, 0) for tid, ns in threads.items()) / 1e9
        if stat - self._stat > per_thread + 2 * self.tick:
            return stat - self._stat, "stat"
        return per_thread, "threads"


def side_name(side: tuple[str, str]) -> str:
    return f"{side[0]}-{side[1]}"


def rendered_tokens(tok: Any, msgs: list[dict[str, Any]]) -> int:
    """Prompt tokens of ``msgs`` rendered whole with the chat template, as both gateways render."""
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return len(tok.encode(text, add_special_tokens=False))


def turns_to_reach(tok: Any, texts: AgentTexts, target: int) -> int:
    """Turns after the warm-up that take a fresh session's prompt to about ``target`` tokens."""
    msgs = texts.history(0, 0)
    first = rendered_tokens(tok, msgs)
    probe = 10
    for i in range(1, probe + 1):
        texts.follow(msgs, {"role": "assistant", "content": texts.reply}, i)
    per_turn = (rendered_tokens(tok, msgs) - first) / probe
    return max(1, math.ceil((target - first) / per_turn))


def plan(quick: bool, tok: Any, texts: AgentTexts) -> list[Workload]:
    if quick:
        return [
            Workload("1x20", "1 session, 20 turns to ~3.7k tokens", 1, 0, 5),
            Workload("64x1k", "64 sessions, ~1k", 64, 1000, 1),
            Workload("256x1k", "256 sessions, ~1k", 256, 1000, 1),
            Workload("1x32k", "1 session growing to 32k tokens", 1, 31_000, 3),
        ]
    return [
        # 20 requests in all (the first a warm-up), the last at ~3.76k tokens
        Workload("1x20", "1 session, 20 turns to ~3.7k tokens", 1, 0, 19),
        Workload("64x1k", "64 sessions, ~1k", 64, 1000, 4),
        Workload("256x1k", "256 sessions, ~1k", 256, 1000, 4),
        Workload("1x32k", "1 session growing to 32k tokens", 1, 0, turns_to_reach(tok, texts, 32_000)),
    ]


class TracerlGw(Gw):
    """``benchmarks.gateway.Gw`` (``python -m core.gateway``) with the peer's session calls."""

    async def open_sessions(self, client: LoadClient, n: int) -> list[str]:
        return await _new_sessions(self, client, n)

    async def finish(self, client: LoadClient, sids: list[str]) -> list[list[dict[str, int]]]:
        """Finish and drop each session; its trace rows as (tokens, trained tokens), which
        ``scenario`` checks."""
        out = []
        for sid in sids:
            trace = await client.get(f"{self.root}/admin/sessions/{sid}/trace", headers=self.admin)
            out.append([{"tokens": len(r["token_ids"]), "trained_tokens": sum(r["loss_mask"])} for r in trace["rows"]])
            await client.post(f"{self.root}/admin/sessions/{sid}/finish", headers=self.admin)
            await client.delete(f"{self.root}/admin/sessions/{sid}", headers=self.admin)
        return out


class BeforeGw(TracerlGw):
    """``python -m core.gateway`` from another checkout (``--before DIR``: tracerl before a
    change), with only the options every version since the gateway's first has taken."""

    def __init__(self, reply: str, tokenizer: str, history_mode: str, code: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([code, str(Path(code) / "plugins" / "local")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "core.gateway", "--reply", reply, "--max-context-tokens", "0", "--sessions", "0",
             "--max-tokens", "64", "--tokenizer", tokenizer, "--history-mode", history_mode],
            stdout=subprocess.PIPE, text=True, env=env, cwd=code,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{code}: python -m core.gateway exited ({self.proc.wait()}) before serving")
        info = json.loads(line)
        self.root = info["root_url"]
        self.admin = {"authorization": f"Bearer {info['admin_token']}"}
        self.ps = psutil.Process(self.proc.pid)


class PeerGw(Gw):
    """``benchmarks/peer_gateway.py`` in its own process, with ``Gw``'s CPU and memory readings."""

    def __init__(self, reply: str, tokenizer: str, history_mode: str, loop: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer_gateway.py"), "--reply", reply, "--tokenizer", tokenizer,
             "--history-mode", history_mode, "--loop", loop],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"benchmarks/peer_gateway.py exited ({self.proc.wait()}) before serving")
        self.root = json.loads(line)["root_url"]
        self.admin: dict[str, str] = {}
        self.ps = psutil.Process(self.proc.pid)

    async def open_sessions(self, client: LoadClient, n: int) -> list[str]:
        sids = [f"bench-{uuid.uuid4().hex}" for _ in range(n)]
        for sid in sids:
            await client.post(f"{self.root}/bench/sessions/{sid}")
        return sids

    async def finish(self, client: LoadClient, sids: list[str]) -> list[list[dict[str, int]]]:
        """Finish and drop each session (the peer's ``finish_session`` and ``drop_session``);
        its trace rows as (tokens, trained tokens), which ``scenario`` checks."""
        out = []
        for sid in sids:
            rows = (await client.post(f"{self.root}/bench/sessions/{sid}/finish"))["rows"]
            out.append([{"tokens": r["tokens"], "trained_tokens": r["trained_tokens"]} for r in rows])
        return out


async def scenario(gw: Any, client: LoadClient, texts: AgentTexts, wl: Workload, run: int,
                   reply_tokens: int) -> dict[str, Any]:
    """One gateway through one workload: warm-up turn, ``wl.turns`` measured turns per session, finish."""
    sids = await gw.open_sessions(client, wl.sessions)
    histories = [texts.history(wl.seed_context, k + 1000 * run) for k in range(wl.sessions)]
    base = [len(h) for h in histories]
    digests = [hashlib.sha256() for _ in sids]
    prompt_tokens: list[list[int]] = [[] for _ in sids]
    last_body = [b""] * len(sids)
    lat: list[float] = []
    sizes: list[int] = []
    errors: list[str] = []

    async def turn(k: int, i: int, measured: bool) -> None:
        msgs = histories[k]
        if len(msgs) != base[k] + 2 * i:
            raise RuntimeError(f"session {k} turn {i}: {len(msgs)} messages; the client must resend the whole history")
        body = json.dumps({"model": "m", "messages": msgs}).encode()
        digests[k].update(body)
        t0 = time.perf_counter()
        out = await client.post(gw.root + "/v1/chat/completions", body=body,
                                headers={"authorization": f"Bearer {sids[k]}"})
        dt = time.perf_counter() - t0
        texts.check(out["choices"][0]["message"])
        # the canonical reply, so both gateways see the same bytes whatever else their reply carries
        texts.follow(msgs, {"role": "assistant", "content": texts.reply}, i)
        prompt_tokens[k].append(int(out["usage"]["prompt_tokens"]))
        last_body[k] = body
        if measured:
            lat.append(dt)
            sizes.append(len(body))

    await asyncio.gather(*(turn(k, 0, False) for k in range(len(sids))))  # warm-up: the one full render
    meter = CpuMeter(gw.proc.pid)
    meter.start()
    t0 = time.perf_counter()

    async def run_session(k: int) -> None:
        for i in range(1, wl.turns + 1):
            await turn(k, i, True)

    await asyncio.gather(*(run_session(k) for k in range(len(sids))))
    wall = time.perf_counter() - t0
    cpu, cpu_source = meter.stop()
    rss = gw.rss_mb()
    rows = await gw.finish(client, sids)
    for k, session_rows in enumerate(rows):
        want = {"tokens": prompt_tokens[k][-1] + reply_tokens, "trained_tokens": (wl.turns + 1) * reply_tokens}
        if session_rows != [want]:
            errors.append(f"session {k}: trace rows {session_rows[:4]}{'...' if len(session_rows) > 4 else ''}, "
                          f"want one row {want}")
            break
    for k, toks in enumerate(prompt_tokens):
        if any(b <= a for a, b in zip(toks, toks[1:], strict=False)):
            errors.append(f"session {k}: prompt tokens did not grow every turn: {toks}")
            break
    n = len(lat)
    every = [t for toks in prompt_tokens for t in toks[1:]]
    return {
        "run": run,
        "workload": wl.key,
        "sessions": wl.sessions,
        "turns": n,
        "wall_s": wall,
        "gateway_cpu_ms_per_turn": 1000 * cpu / n,
        "cpu_source": cpu_source,
        "p50_ms": 1000 * statistics.median(lat),
        "context_mean": statistics.mean(every),
        "context_last": max(toks[-1] for toks in prompt_tokens),
        "body_kb": statistics.mean(sizes) / 1024,
        "gateway_rss_mb": rss,
        "errors": errors,
        # for the cross-gateway checks (dropped from the output)
        "_bodies": hashlib.sha256(b"".join(d.digest() for d in digests)).hexdigest(),
        "_tokens": prompt_tokens,
        "_last_body0": last_body[0],
    }


def cross_check(tok: Any, cell: dict[str, dict[str, Any]]) -> None:
    """Same bodies and token counts on every gateway; session 0's last prompt as long as a
    local render of the history it sent."""
    first = next(iter(cell.values()))
    bodies, tokens = first["_bodies"], first["_tokens"]
    local = rendered_tokens(tok, json.loads(first["_last_body0"])["messages"])
    for res in cell.values():
        if res["_bodies"] != bodies:
            res["errors"].append("request bodies differ from the other gateways'")
        if res["_tokens"] != tokens:
            res["errors"].append("prompt token counts differ from the other gateways'")
        if res["_tokens"][0][-1] != local:
            res["errors"].append(f"session 0's last prompt: {res['_tokens'][0][-1]} tokens; a local render "
                                 f"of the history sent: {local}")
        res["bodies_sha256"] = res.pop("_bodies")
        res["local_render_last_prompt"] = local
        del res["_tokens"], res["_last_body0"]


def summarize(results: list[dict[str, Any]], workloads: list[Workload]) -> list[dict[str, Any]]:
    """Medians over runs per workload and gateway, and the peer's and the earlier checkout's
    ratios to tracerl's."""
    out = []
    for wl in workloads:
        row: dict[str, Any] = {"workload": wl.key, "label": wl.label, "sessions": wl.sessions, "turns": wl.turns}
        for side in sides(before=True):
            rs = [r for r in results if r["workload"] == wl.key and r["side"] == side_name(side)]
            if not rs:
                continue
            name = side_name(side)
            cpus = [r["gateway_cpu_ms_per_turn"] for r in rs]
            row[f"{name}_cpu_ms"] = statistics.median(cpus)
            row[f"{name}_cpu_ms_range"] = [min(cpus), max(cpus)]
            row[f"{name}_p50_ms"] = statistics.median(r["p50_ms"] for r in rs)
            row[f"{name}_ok"] = not any(r["errors"] for r in rs)
            # The same on every side (cross_check compares the prompt token counts): the last side's.
            row["context_mean"] = round(statistics.median(r["context_mean"] for r in rs))
            row["context_last"] = max(r["context_last"] for r in rs)
        for mode in MODES:
            t = row.get(f"tracerl-{mode}_cpu_ms")
            for other in ("peer", "before"):
                o = row.get(f"{other}-{mode}_cpu_ms")
                if o is not None and t:
                    row[f"{other}_over_tracerl_{mode}"] = o / t
        row["issue"] = dict(zip(("peer-linear", "peer-tree", "tracerl-linear", "tracerl-tree"),
                                ISSUE.get(wl.key, ()), strict=False))
        out.append(row)
    return out


def table(summary: list[dict[str, Any]]) -> str:
    def pair(row: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str:
        cells = []
        for mode in MODES:
            gw, _, what = key.partition(":")
            v = row.get(f"{gw}-{mode}_{what}")
            mark = "" if row.get(f"{gw}-{mode}_ok", True) else "!"
            cells.append("n/a" if v is None else fmt.format(v) + mark)
        return " / ".join(cells)

    before = any("before-linear_cpu_ms" in row for row in summary)
    lines = [
        "| workload | peer CPU ms/turn (linear / tree) | tracerl (linear / tree) | peer/tracerl (linear / tree) "
        + ("| tracerl before (linear / tree) | before/now (linear / tree) " if before else "")
        + "| p50 ms peer (linear / tree) | p50 ms tracerl (linear / tree) | context tokens (mean / last) |",
        "|---|---|---|---|" + ("---|---|" if before else "") + "---|---|---|",
    ]

    def ratios(row: dict[str, Any], other: str) -> str:
        return " / ".join(f"{row[f'{other}_over_tracerl_{m}']:.2f}" if f"{other}_over_tracerl_{m}" in row else "n/a"
                          for m in MODES)

    for row in summary:
        then = f"| {pair(row, 'before:cpu_ms')} | {ratios(row, 'before')} " if before else ""
        lines.append(f"| {row['label']} | {pair(row, 'peer:cpu_ms')} | {pair(row, 'tracerl:cpu_ms')} "
                     f"| {ratios(row, 'peer')} {then}| {pair(row, 'peer:p50_ms')} | {pair(row, 'tracerl:p50_ms')} "
                     f"| {row['context_mean']} / {row['context_last']} |")
    return "\n".join(lines)


async def bench(args: argparse.Namespace, tokenizer_dir: str) -> tuple[list[dict[str, Any]], list[Workload]]:
    tok = load_tokenizer(tokenizer_dir)
    texts = AgentTexts(tok)
    reply_tokens = len(encode_reply(tok, texts.reply))
    workloads = plan(args.quick, tok, texts)
    if args.workload:
        keys = args.workload.split(",")
        unknown = set(keys) - {w.key for w in workloads}
        if unknown:
            raise SystemExit(f"--workload: unknown {sorted(unknown)}; choose from {[w.key for w in workloads]}")
        workloads = [w for w in workloads if w.key in keys]
    print("workloads: " + "; ".join(f"{w.key}: {w.sessions} x ({w.turns} turns after a warm-up from "
                                    f"{'a fresh start' if not w.seed_context else f'~{w.seed_context} tokens'})"
                                    for w in workloads), flush=True)
    gws: dict[tuple[str, str], Any] = {}
    results: list[dict[str, Any]] = []
    every = sides(before=bool(args.before))
    try:
        t0 = time.perf_counter()
        for side in every:
            gw, mode = side
            if gw == "tracerl":
                gws[side] = TracerlGw(texts.reply, tokenizer_dir, history_mode=mode)
            elif gw == "peer":
                gws[side] = PeerGw(texts.reply, tokenizer_dir, mode, args.peer_loop)
            else:
                gws[side] = BeforeGw(texts.reply, tokenizer_dir, mode, args.before)
        print(f"{len(every)} gateways serving after {time.perf_counter() - t0:.1f} s", flush=True)
        async with contextlib.AsyncExitStack() as stack:
            clients = {side: await stack.enter_async_context(LoadClient(300, timeout_s=300)) for side in every}
            for run in range(args.runs):
                for wi, wl in enumerate(workloads):
                    shift = (run + wi) % len(every)
                    order = every[shift:] + every[:shift]
                    cell: dict[str, dict[str, Any]] = {}
                    load = os.getloadavg()[0]
                    t_cell = time.perf_counter()
                    for side in order:
                        res = await scenario(gws[side], clients[side], texts, wl, run, reply_tokens)
                        res.update(side=side_name(side), gateway=side[0], mode=side[1], load_average=load)
                        cell[side_name(side)] = res
                    cross_check(tok, cell)
                    print(f"run {run} {wl.key}: {time.perf_counter() - t_cell:.1f} s", flush=True)
                    for side in order:
                        res = cell[side_name(side)]
                        results.append(res)
                        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
                                          if k != "bodies_sha256"}), flush=True)
    finally:
        for gw in gws.values():
            gw.close()
    return results, workloads


@contextlib.contextmanager
def checkout(where: str) -> Iterator[str]:
    """``where`` if it is a directory, else a temporary git worktree of commit ``where``."""
    if Path(where).is_dir():
        yield str(Path(where).resolve())
        return
    folder = tempfile.mkdtemp(prefix="tracerl-before-")
    root = HERE.parent
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q", folder, where], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", folder], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="interleaved runs; the table gives medians (default 3, "
                                                            "1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few turns (one run unless --runs is given)")
    ap.add_argument("--workload", default="", help="only these workloads, comma-separated: 1x20,64x1k,256x1k,1x32k")
    ap.add_argument("--peer-loop", choices=["asyncio", "uvloop"], default="asyncio",
                    help="the peer's event loop (it ships asyncio's; tracerl uses uvloop when installed)")
    ap.add_argument("--before", default="", metavar="DIR_OR_COMMIT",
                    help="also run tracerl's gateway from this checkout, or from this commit (checked out in a "
                         f"temporary git worktree); {BEFORE_32} is the commit before issue #32's changes")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    workdir = tempfile.TemporaryDirectory(prefix="tracerl-bench-tokenizer-")
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.callback(workdir.cleanup)
        if args.before:
            args.before = stack.enter_context(checkout(args.before))
        tokenizer_dir = tokenizer_source("qwen3", Path(workdir.name))
        results, workloads = asyncio.run(bench(args, tokenizer_dir))
    summary = summarize(results, workloads)
    print(f"\nCPU ms per turn of the gateway process, medians of {args.runs} run(s); Qwen3 tokenizer, ChatML "
          f"template; zero-latency samplers; took {time.perf_counter() - t0:.0f} s"
          + ("; --quick: fewer turns than the labels say (see 'workloads:' above)" if args.quick else "") + "\n")
    print(table(summary))
    print("\nthe issue's figures (before tracerl's optimisation):")
    for row in summary:
        issue = row["issue"]
        if issue:
            print(f"  {row['label']}: peer {issue['peer-linear']} / {issue['peer-tree']}, "
                  f"tracerl {issue['tracerl-linear']} / {issue['tracerl-tree']}")
    failures = [f"{r['side']} {r['workload']} run {r['run']}: {e}" for r in results for e in r["errors"]]
    if failures:
        print("\nfailed checks (cells marked !):")
        for f in failures:
            print("  " + f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "quick": args.quick, "peer_loop": args.peer_loop, "before": args.before,
                       "workloads": [dataclasses.asdict(w) for w in workloads], "summary": summary, "results": results},
                      f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

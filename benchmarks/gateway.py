"""Gateway throughput and per-turn cost with a zero-latency sampler.

    python benchmarks/gateway.py                   # both workloads (~3-5 minutes on 2 cores)
    python benchmarks/gateway.py --workload agent  # only the agent workload
    python benchmarks/gateway.py --quick           # smaller, for a smoke check

Starts ``python -m core.gateway`` (scripted sampler, tiny tokenizer) in its own
process and drives it over real HTTP with httpx from this one. Reported per
scenario:

- turns/s and client-observed per-turn latency p50/p99 (wall clock; the load
  generator shares the 2 cores with the gateway, so these understate it);
- gateway CPU time per turn: user + system CPU of the whole gateway process
  (every thread, read from ``/proc``) over the measured turns, divided by the
  turns; the fair figure here.

Workloads:

- ``append``: a fixed ~1k/8k/32k-token system message, then short user
  questions; 1, 64 and 256 concurrent sessions at ~1k, one session at 1k, 8k
  and 32k tokens of context.
- ``agent``: what agents do. Each session has a 256-token system message,
  128-token user turns and 33-token replies (32 tokens and the end-of-turn
  token), and every request resends the whole history. A session is seeded
  with a history of about the target context (its first request, a full render,
  is a warm-up and not measured), then runs ``turns`` measured turns, each
  appending the reply and a new user turn (161 tokens); ``context`` is the mean
  prompt length of the measured turns. Sessions 1 and 256 at 1k, 8k and 32k.

Each session's first turn (the one full render) is a warm-up and not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import psutil

REPLY = "ok"
AGENT_REPLY_TOKENS = 32
"""Reply tokens of the agent workload, before the end-of-turn token (33 generated in all)."""


def _filler(tok: Any, n_tokens: int) -> str:
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
    parts: list[str] = []
    i = 0
    while True:
        parts.append(" ".join(words[(i + j) % 10] + str(i % 97) for j in range(50)))
        i += 1
        text = "\n".join(parts)
        if len(tok.encode(text, add_special_tokens=False)) >= n_tokens:
            return text


def _exact(tok: Any, n_tokens: int, seed: int) -> str:
    """A text of exactly ``n_tokens`` tokens (words drawn from ``seed``, trimmed token by token)."""
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
    text = " ".join(words[(seed * 7 + j * 3) % 10] + str((seed + j) % 89) for j in range(n_tokens))
    ids = tok.encode(text, add_special_tokens=False)[:n_tokens]
    return str(tok.decode(ids))


class Gw:
    """The gateway, in its own process."""

    def __init__(self, reply: str = REPLY) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "core.gateway", "--reply", reply, "--max-context-tokens", "0",
             "--sessions", "0", "--max-tokens", "64"],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.root = info["root_url"]
        self.admin = {"authorization": f"Bearer {info['admin_token']}"}
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        """CPU seconds (user + system, all threads) the gateway process has used.

        Read from each thread's ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds;
        the gateway's threads live as long as it does), else psutil (clock ticks of 10 ms).
        """
        try:
            total = 0
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            return total / 1e9
        except (OSError, ValueError, IndexError):
            t = self.ps.cpu_times()
            return float(t.user + t.system)

    def rss_mb(self) -> float:
        """The gateway process's resident memory now, in MB."""
        return float(self.ps.memory_info().rss) / 2**20

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)



async def _finish_linear(client: Any, gw: Any, sids: list[str], turns: int) -> None:
    """Finish and drop each session, checking it stayed one linear row of ``turns`` turns."""
    for sid in sids:
        rows = (await client.post(f"{gw.root}/admin/sessions/{sid}/finish", headers=gw.admin)).json()["rows"]
        assert len(rows) == 1 and len(rows[0]["turns"]) == turns, "session did not stay one linear row"
        await client.delete(f"{gw.root}/admin/sessions/{sid}", headers=gw.admin)

async def _scenario(gw: Gw, client: httpx.AsyncClient, concurrency: int, turns: int, system: str) -> dict[str, Any]:
    sids = []
    for _ in range(concurrency):
        r = await client.post(gw.root + "/admin/sessions", headers=gw.admin, json={})
        sids.append(r.json()["session_id"])
    histories = {sid: [{"role": "system", "content": system}] for sid in sids}

    async def turn(sid: str, i: int) -> float:
        msgs = histories[sid]
        msgs.append({"role": "user", "content": f"question {i}: what next?"})
        t0 = time.perf_counter()
        r = await client.post(gw.root + "/v1/chat/completions", headers={"authorization": f"Bearer {sid}"},
                              json={"model": "m", "messages": msgs})
        dt = time.perf_counter() - t0
        r.raise_for_status()
        msgs.append(r.json()["choices"][0]["message"])
        return dt

    await asyncio.gather(*(turn(s, 0) for s in sids))  # warm-up: the one full render per session
    cpu0 = gw.cpu()
    t0 = time.perf_counter()

    async def run(sid: str) -> list[float]:
        return [await turn(sid, i) for i in range(1, turns + 1)]

    lat = [x for xs in await asyncio.gather(*(run(s) for s in sids)) for x in xs]
    wall = time.perf_counter() - t0
    cpu1 = gw.cpu()
    await _finish_linear(client, gw, sids, turns + 1)
    n = len(lat)
    lat.sort()
    return {
        "workload": "append",
        "sessions": concurrency,
        "turns": n,
        "turns_per_s": n / wall,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(n - 1, int(0.99 * n))],
        "gateway_cpu_ms_per_turn": 1000 * (cpu1 - cpu0) / n,
    }


class AgentTexts:
    """The agent workload's texts: a 256-token system message, 128-token user turns, the reply."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.system = _exact(tok, 256, 0)
        self._users = [_exact(tok, 128, i) for i in range(1, 41)]
        self.reply = _exact(tok, AGENT_REPLY_TOKENS, 99)

    def user(self, i: int) -> str:
        """User turn ``i`` (40 distinct texts; a turn number in front keeps every turn unique)."""
        return f"[{i}] " + self._users[i % len(self._users)]

    def history(self, context: int, sid_index: int) -> list[dict[str, Any]]:
        """System + (user, reply) pairs + a last user turn, about ``context`` tokens rendered."""
        msgs: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        per_pair = 128 + AGENT_REPLY_TOKENS + 1 + 10  # + end-of-turn and ChatML framing
        n = max(0, (context - 256 - 128) // per_pair)
        for i in range(n):
            msgs.append({"role": "user", "content": self.user(sid_index + i)})
            msgs.append({"role": "assistant", "content": self.reply})
        msgs.append({"role": "user", "content": self.user(sid_index + n)})
        return msgs


async def _agent_scenario(
    gw: Gw, client: httpx.AsyncClient, texts: AgentTexts, sessions: int, context: int, turns: int, rounds: int
) -> dict[str, Any]:
    """``rounds`` times: seed ``sessions`` sessions at ``context`` tokens, then ``turns`` measured turns each."""
    lat: list[float] = []
    prompt_tokens: list[int] = []
    body_bytes: list[int] = []
    cpu = wall = 0.0
    histories: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(rounds):
        sids = []
        for _ in range(sessions):
            r = await client.post(gw.root + "/admin/sessions", headers=gw.admin, json={})
            sids.append(r.json()["session_id"])
        histories.clear()
        histories.update({sid: texts.history(context, i + 1000 * rnd) for i, sid in enumerate(sids)})

        async def turn(sid: str, i: int, measured: bool) -> None:
            msgs = histories[sid]
            if i:
                msgs.append({"role": "user", "content": texts.user(10_000 + i)})
            body = json.dumps({"model": "m", "messages": msgs}).encode()
            t0 = time.perf_counter()
            r = await client.post(gw.root + "/v1/chat/completions", content=body,
                                  headers={"authorization": f"Bearer {sid}", "content-type": "application/json"})
            dt = time.perf_counter() - t0
            r.raise_for_status()
            out = r.json()
            msg = out["choices"][0]["message"]
            if msg["content"] != texts.reply:
                raise AssertionError(f"unexpected reply {msg['content']!r:.80}")
            msgs.append(msg)
            if measured:
                lat.append(dt)
                prompt_tokens.append(out["usage"]["prompt_tokens"])
                body_bytes.append(len(body))

        await asyncio.gather(*(turn(s, 0, False) for s in sids))  # warm-up: the one full render
        cpu0 = gw.cpu()
        t0 = time.perf_counter()

        async def run(sid: str) -> None:
            for i in range(1, turns + 1):
                await turn(sid, i, True)

        await asyncio.gather(*(run(s) for s in sids))
        wall += time.perf_counter() - t0
        cpu += gw.cpu() - cpu0
        await _finish_linear(client, gw, sids, turns + 1)
    n = len(lat)
    lat.sort()
    return {
        "workload": "agent",
        "sessions": sessions,
        "context_tokens": round(statistics.mean(prompt_tokens)),
        "body_kb": statistics.mean(body_bytes) / 1024,
        "turns": n,
        "turns_per_s": n / wall,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(n - 1, int(0.99 * n))],
        "gateway_cpu_ms_per_turn": 1000 * cpu / n,
        "gateway_rss_mb": gw.rss_mb(),
    }


AGENT_GRID = ((1, 1000), (256, 1000), (1, 8000), (256, 8000), (1, 32000), (256, 32000))
"""(sessions, context tokens) of the agent workload."""


async def _agent(quick: bool, grid: tuple[tuple[int, int], ...]) -> list[dict[str, Any]]:
    from core.tokenizer import build_tiny_tokenizer

    texts = AgentTexts(build_tiny_tokenizer())
    gw = Gw(texts.reply)
    results = []
    try:
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            for sessions, context in grid:
                if sessions == 1:
                    turns, rounds = (5, 2) if quick else (6, 10)
                else:
                    turns, rounds = (2, 1) if quick else (4, 1)
                res = await _agent_scenario(gw, client, texts, sessions, context, turns, rounds)
                res["target_context"] = context
                results.append(res)
                print(json.dumps(res), flush=True)
    finally:
        gw.close()
    return results


async def _append(quick: bool) -> list[dict[str, Any]]:
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    gw = Gw()
    results = []
    try:
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            ctx1k = _filler(tok, 1000)
            for conc in (1, 64, 256):
                turns = (20 if conc == 1 else 3) if quick else (200 if conc == 1 else 8 if conc == 64 else 4)
                res = await _scenario(gw, client, conc, turns, ctx1k)
                res["context_tokens"] = 1000
                results.append(res)
                print(json.dumps(res), flush=True)
            for ctx in (1000, 8000, 32000):
                res = await _scenario(gw, client, 1, 20 if quick else 150, _filler(tok, ctx))
                res["context_tokens"] = ctx
                results.append(res)
                print(json.dumps(res), flush=True)
    finally:
        gw.close()
    return results


def _parse_grid(text: str) -> tuple[tuple[int, int], ...]:
    """``"256x1000,1x32000"`` as ((256, 1000), (1, 32000))."""
    out = []
    for item in text.split(","):
        s, _, c = item.strip().partition("x")
        out.append((int(s), int(c)))
    return tuple(out)


def main() -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workload", choices=["all", "append", "agent"], default="all")
    ap.add_argument("--grid", default="", help="agent workload cells as SESSIONSxCONTEXT,... (default: all six)")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    if args.workload in ("all", "append"):
        results += asyncio.run(_append(args.quick))
    if args.workload in ("all", "agent"):
        results += asyncio.run(_agent(args.quick, _parse_grid(args.grid) if args.grid else AGENT_GRID))
    print(f"\n{'workload':>8} {'sessions':>8} {'context':>8} {'turns':>6} {'turns/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'gw CPU ms/turn':>15}")
    for r in results:
        print(f"{r['workload']:>8} {r['sessions']:>8} {r['context_tokens']:>8} {r['turns']:>6} {r['turns_per_s']:>8.0f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['gateway_cpu_ms_per_turn']:>15.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

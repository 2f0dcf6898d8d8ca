"""Gateway throughput and per-turn cost with a zero-latency sampler.

    python benchmarks/gateway.py            # full run (~1-2 minutes on 2 cores)
    python benchmarks/gateway.py --quick    # smaller, for a smoke check

Starts ``python -m core.gateway`` (scripted sampler, tiny tokenizer) in a
subprocess and drives it over HTTP with httpx. Reported per scenario:

- turns/s and client-observed per-turn latency p50/p99 (wall clock; the load
  generator shares the 2 cores with the gateway, so these understate it);
- gateway CPU time per turn: the gateway process's ``process_time`` delta over
  the measured turns (read from ``/admin/stats``), the fair figure here.

Scenarios: 1, 64 and 256 concurrent append-only sessions at ~1k tokens of
context; one session at ~1k, 8k and 32k tokens of context (linear mode),
where the cost per turn must stay roughly flat. Each session's first turn (the
one full render) is a warm-up and not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

REPLY = "ok"


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


class Gw:
    """The gateway subprocess."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "core.gateway", "--reply", REPLY, "--max-context-tokens", "0",
             "--sessions", "0", "--max-tokens", "16"],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.root = info["root_url"]
        self.admin = {"authorization": f"Bearer {info['admin_token']}"}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


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
    cpu0 = (await client.get(gw.root + "/admin/stats", headers=gw.admin)).json()["process_time"]
    t0 = time.perf_counter()

    async def run(sid: str) -> list[float]:
        return [await turn(sid, i) for i in range(1, turns + 1)]

    lat = [x for xs in await asyncio.gather(*(run(s) for s in sids)) for x in xs]
    wall = time.perf_counter() - t0
    cpu1 = (await client.get(gw.root + "/admin/stats", headers=gw.admin)).json()["process_time"]
    for sid in sids:
        rows = (await client.post(f"{gw.root}/admin/sessions/{sid}/finish", headers=gw.admin)).json()["rows"]
        assert len(rows) == 1 and len(rows[0]["turns"]) == turns + 1, "session did not stay one linear row"
        await client.delete(f"{gw.root}/admin/sessions/{sid}", headers=gw.admin)
    n = len(lat)
    lat.sort()
    return {
        "sessions": concurrency,
        "turns": n,
        "turns_per_s": n / wall,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(n - 1, int(0.99 * n))],
        "gateway_cpu_ms_per_turn": 1000 * (cpu1 - cpu0) / n,
    }


async def _main(quick: bool) -> list[dict[str, Any]]:
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


def main() -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()
    results = asyncio.run(_main(args.quick))
    print(f"\n{'sessions':>8} {'context':>8} {'turns':>6} {'turns/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'gw CPU ms/turn':>15}")
    for r in results:
        print(f"{r['sessions']:>8} {r['context_tokens']:>8} {r['turns']:>6} {r['turns_per_s']:>8.0f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['gateway_cpu_ms_per_turn']:>15.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

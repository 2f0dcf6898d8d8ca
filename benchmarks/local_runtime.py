"""Benchmark of the local runtime: rollouts per second and memory per in-flight session.

Run from the repository root::

    python benchmarks/local_runtime.py                 # 64 and 256 concurrent sessions
    python benchmarks/local_runtime.py --concurrency 64 --processes 2 --json out.json

The agent is trivial (one chat completion through the real gateway, reward 1)
and the model is the scripted sampler, so the figures measure the runtime and
gateway plumbing, not a model. Two phases per concurrency C:

- throughput: ``rounds * C`` rollouts, C in flight at a time, sampler without delay, and the
  agent processes' CPU per rollout (user + system, from /proc);
- memory: C rollouts held in flight (the sampler sleeps ``--hold-s``), resident
  memory of the agent processes and of this (trainer + gateway) process sampled
  at the peak and compared with the idle pool.

This file is also the agent module (``local_runtime:app``): the agent processes
import only the few lines above ``main``.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from core.agent import AgentApp, ModelConfig

app = AgentApp()
_client: httpx.AsyncClient | None = None


@app.entrypoint
async def trivial(payload: dict[str, Any]) -> dict[str, Any]:
    """One chat completion through the gateway, then reward 1."""
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1024))
    cfg = ModelConfig.from_payload(payload)
    r = await _client.post(
        f"{cfg.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {cfg.api_key}"},
        json={"model": cfg.model_id, "messages": [{"role": "user", "content": payload["prompt"]}]},
    )
    r.raise_for_status()
    return {"reward": 1.0, "metrics": {"chars": len(r.json()["choices"][0]["message"]["content"])}}


def _rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (0 if gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (0 if gone), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class Workload:
    """The benchmarks' workload (shared with ``benchmarks/ray_runtime.py``): the real gateway
    with the scripted sampler on loopback, and rollouts of this module's agent through a runtime.

    Use ``async with Workload() as w``; ``w.one(runtime)`` runs one rollout in a fresh session.
    """

    AGENT = "local_runtime:app"
    """The agent app, importable by agent processes given ``env``."""

    def __init__(self) -> None:
        from core.gateway import Gateway, GatewayConfig, GatewayServer
        from core.samplers import ScriptedSampler, encode_reply
        from core.tokenizer import build_tiny_tokenizer

        tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320)
        self.sampler = ScriptedSampler(default=encode_reply(tok, "42"), tokenizer=tok, record_calls=False)
        self.gateway = Gateway(tokenizer=tok, sampler=self.sampler, config=GatewayConfig(), model_id="tiny")
        self.server = GatewayServer(self.gateway, host="127.0.0.1", port=0)
        here = os.path.dirname(os.path.abspath(__file__))
        self.env = {"PYTHONPATH": os.pathsep.join([here, os.getcwd()])}
        """Environment for the agent processes (this folder and the checkout on the path)."""

    async def __aenter__(self) -> Workload:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop()

    async def one(self, runtime: Any) -> Any:
        """One rollout (a fresh gateway session, dropped after); returns the ``RolloutResult``."""
        import uuid

        from core.types import RolloutRequest, SamplingParams

        gw = self.gateway
        sid = gw.create_session(sampling=SamplingParams(max_tokens=8))
        req = RolloutRequest(
            rollout_id=uuid.uuid4().hex,
            group_id="g",
            payload={"prompt": "What is 6 times 7?"},
            base_url=self.server.base_url,
            session_id=sid,
            model_id="tiny",
            timeout_s=300,
        )
        res = await runtime.run_rollout(req)
        gw.finish_session(sid)
        gw.drop_session(sid)
        return res


async def _bench(concurrency: int, processes: int, rounds: int, hold_s: float) -> dict[str, Any]:
    import asyncio
    import time

    from core.runtime.local import LocalRuntime
    from core.types import RolloutStatus

    async with Workload() as w:
        rt = LocalRuntime(w.AGENT, env=w.env, num_processes=processes, max_concurrency=concurrency)
        await rt.start()
        try:
            await asyncio.gather(*(w.one(rt) for _ in range(min(concurrency, 32))))  # warm up
            total = rounds * concurrency
            pids = [p.pid for p in rt.processes if p.pid]
            cpu0 = sum(_cpu_s(p) for p in pids)
            t0 = time.perf_counter()
            results = await asyncio.gather(*(w.one(rt) for _ in range(total)))
            wall = time.perf_counter() - t0
            agent_cpu = sum(_cpu_s(p) for p in pids) - cpu0
            ok = sum(r.status is RolloutStatus.OK for r in results)

            await asyncio.sleep(0.5)
            idle_agents = sum(_rss_kib(p) for p in pids)
            idle_self = _rss_kib(os.getpid())
            w.sampler.delay_s = hold_s
            held = [asyncio.create_task(w.one(rt)) for _ in range(concurrency)]
            await asyncio.sleep(hold_s * 0.6)
            busy = sum(p.in_flight for p in rt.processes)
            peak_agents = sum(_rss_kib(p) for p in pids)
            peak_self = _rss_kib(os.getpid())
            held_results = await asyncio.gather(*held)
            w.sampler.delay_s = 0.0
        finally:
            await rt.aclose()
    return {
        "concurrency": concurrency,
        "processes": processes,
        "rollouts": total,
        "ok": ok,
        "wall_s": round(wall, 3),
        "rollouts_per_s": round(total / wall, 1),
        "agent_cpu_ms_per_rollout": round(1000 * agent_cpu / total, 2),
        "in_flight_at_sample": busy,
        "held_ok": sum(r.status is RolloutStatus.OK for r in held_results),
        "agent_rss_idle_mib": round(idle_agents / 1024, 1),
        "agent_kib_per_session": round((peak_agents - idle_agents) / max(busy, 1), 1),
        "trainer_kib_per_session": round((peak_self - idle_self) / max(busy, 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import asyncio
    import json

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=4, help="throughput rollouts = rounds * concurrency"
    )
    parser.add_argument(
        "--hold-s", type=float, default=3.0, help="sampler delay in the memory phase"
    )
    parser.add_argument("--json", default="", help="also write the figures here")
    args = parser.parse_args(argv)
    rows = [
        asyncio.run(_bench(c, args.processes, args.rounds, args.hold_s)) for c in args.concurrency
    ]
    header = (
        f"{'C':>5} {'rollouts/s':>11} {'ok':>9} {'agent CPU ms':>12} {'in flight':>9} {'agent KiB/sess':>15} "
        f"{'trainer KiB/sess':>17}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['concurrency']:>5} {r['rollouts_per_s']:>11} {r['ok']:>4}/{r['rollouts']:<4} "
            f"{r['agent_cpu_ms_per_rollout']:>12} {r['in_flight_at_sample']:>9} {r['agent_kib_per_session']:>15} {r['trainer_kib_per_session']:>17}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

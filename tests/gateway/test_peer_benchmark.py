"""benchmarks/gateway_peer.py on its smallest run: tracerl's gateway and agentcore-rl-toolkit
0.2.0's (the peer, ``benchmarks/peer_gateway.py``), linear and tree history each, one short
workload. The benchmark checks every cell itself (byte-identical request bodies to all four
gateways, the same prompt token counts turn by turn, growing, one row per session holding
every turn) and exits 1 when a check fails; this runs it and reads its JSON: every gateway
measured, every check passed. The peer's sampler edge is a zero-latency stand-in, as
tracerl's scripted sampler is on tracerl's side (the module docstring says why)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDES = {"tracerl-linear", "tracerl-tree", "peer-linear", "peer-tree"}


@pytest.mark.integration
@pytest.mark.slow
def test_the_peer_benchmark_measures_both_gateways_in_both_modes_and_its_checks_pass(tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gateway_peer.py", "--quick", "--workload", "1x20", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text(encoding="utf-8"))
    results = data["results"]
    assert {r["side"] for r in results} == SIDES
    for r in results:
        assert r["errors"] == [], r
        assert r["turns"] == 5 and r["gateway_cpu_ms_per_turn"] > 0, r
        assert r["context_last"] > r["context_mean"] > 0  # each turn resent a longer history
    (row,) = data["summary"]
    assert all(row[f"{side}_ok"] for side in SIDES)
    assert "| 1 session, 20 turns to ~3.7k tokens |" in proc.stdout

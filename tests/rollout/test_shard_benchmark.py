"""benchmarks/gateway_shards.py with Qwen3's tokenizer (``--tokenizer qwen3``), on its smallest grid:
one and two shards, two sessions of one measured turn each. The benchmark itself checks each
session's trace (one linear row, every turn in it); this checks that it ran on the real
tokenizer and reports each shard process's peak resident memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SHARD_PEAK_MB = (40, 200)
"""Plausible bounds on a Qwen3 shard's ``VmHWM`` after two short sessions: above the
interpreter with the gateway's imports (about 47 MB), below the 275 MB a shard peaks at when
it loads the tokenizer with ``from_pretrained`` instead of the split copy (it read 137 MB,
2026-12-02; tests/rollout/test_shard_tokenizer.py bounds it more tightly). Resident memory
does not depend on the machine's load."""


@pytest.mark.integration
@pytest.mark.slow
def test_the_shard_benchmark_runs_on_qwen3s_tokenizer_and_reports_each_shards_peak_memory(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gateway_shards.py", "--tokenizer", "qwen3", "--shards", "1,2",
         "--sessions", "2", "--turns", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = json.loads(out.read_text(encoding="utf-8"))
    assert [r["shards"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tokenizer"] == "qwen3" and r["turns"] == 2
        assert len(r["shard_peak_mb"]) == r["shards"], r
        low, high = SHARD_PEAK_MB
        assert all(low < mb < high for mb in r["shard_peak_mb"]), r["shard_peak_mb"]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("shards=2, 2 sessions:")]
    assert len(summary) == 1 and "shard peak (VmHWM) " in summary[0], proc.stdout
    peaks = "/".join(f"{mb:.0f}" for mb in rows[1]["shard_peak_mb"])
    assert summary[0].endswith(f"shard peak (VmHWM) {peaks} MB"), summary[0]
    # The shards loaded the split copy: a fallback to from_pretrained warns on their stderr.
    assert "loading it with" not in proc.stderr, proc.stderr[-4000:]

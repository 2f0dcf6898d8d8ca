"""The end-of-run report: an HTML page with the reward curves (inline SVG, no plotting
library needed) and the final figures (with the tool calls that failed to parse, when
the run offered tools). Built from ``read_metrics``, so steps an interrupted run logged
and its resumed run replayed count once."""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any

from core.rundir.metrics import read_metrics
from core.types import ParseStatus

_W, _H, _PAD = 640, 260, 36


def _polyline(points: list[tuple[float, float]], x_max: float, color: str) -> str:
    if not points:
        return ""
    coords = []
    for x, y in points:
        px = _PAD + (x / max(x_max, 1.0)) * (_W - 2 * _PAD)
        py = _H - _PAD - max(0.0, min(1.0, y)) * (_H - 2 * _PAD)
        coords.append(f"{px:.1f},{py:.1f}")
    return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(coords)}"/>'


def _series(records: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """``(step, value)`` of ``key``, one point per step (the last record of a step wins)."""
    by_step: dict[float, float] = {}
    for r in records:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and "step" in r:
            by_step[float(r["step"])] = float(v)
    return sorted(by_step.items())


def _parse_failures(records: list[dict[str, Any]]) -> str | None:
    """The run's tool calls that failed to parse, by status (``gateway/parse/*``, each step
    once); None when no step offered tools."""
    steps: dict[Any, dict[str, Any]] = {}
    for r in records:
        if "gateway/turns_with_tools" in r and "step" in r:
            steps[r["step"]] = r

    def total(key: str) -> int:
        return int(sum(float(r.get(key) or 0) for r in steps.values()))

    offered = total("gateway/turns_with_tools")
    if offered <= 0:
        return None
    failed = {s.value: total(f"gateway/parse/{s.value}") for s in ParseStatus if s.failed}
    why = ", ".join(f"{n} {s}" for s, n in failed.items() if n)
    n = sum(failed.values())
    return f"{n} of {offered} turns with tools ({n / offered:.1%})" + (f": {why}" if why else "")


def write_report(run_dir: Path) -> Path:
    """Write ``<run_dir>/report.html`` from ``metrics.jsonl``; returns its path."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = _series(records, "reward/mean")
    evals = _series(records, "eval/reward_mean")
    x_max = max([x for x, _ in train + evals] or [1.0])
    grid = "".join(
        f'<line x1="{_PAD}" x2="{_W - _PAD}" y1="{_H - _PAD - g * (_H - 2 * _PAD):.1f}" '
        f'y2="{_H - _PAD - g * (_H - 2 * _PAD):.1f}" stroke="#ddd"/>'
        f'<text x="4" y="{_H - _PAD - g * (_H - 2 * _PAD) + 4:.1f}" font-size="11">{g:.2f}</text>'
        for g in (0.0, 0.25, 0.5, 0.75, 1.0)
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}">{grid}'
        f"{_polyline(train, x_max, '#1f77b4')}{_polyline(evals, x_max, '#d62728')}"
        f'<text x="{_W / 2:.0f}" y="{_H - 6}" font-size="12" text-anchor="middle">step (0 - {x_max:.0f})</text>'
        "</svg>"
    )
    first = train[0][1] if train else float("nan")
    last5 = [y for _, y in train[-5:]]
    final = sum(last5) / len(last5) if last5 else float("nan")
    rows = [
        ("steps", f"{x_max:.0f}"),
        ("train reward, first step", f"{first:.3f}"),
        ("train reward, mean of last 5 steps", f"{final:.3f}"),
        ("eval reward, first / last", f"{evals[0][1]:.3f} / {evals[-1][1]:.3f}" if evals else "n/a"),
    ]
    parse = _parse_failures(records)
    if parse is not None:
        rows.append(("tool calls that failed to parse", parse))
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>tracerl run report</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:2px 12px}</style></head><body>"
        f"<h1>tracerl run report</h1><p>{html.escape(str(run_dir))}</p>{svg}"
        "<p><span style='color:#1f77b4'>&#9632; train reward (mean per step)</span> &nbsp; "
        "<span style='color:#d62728'>&#9632; eval reward</span></p>"
        f"<table>{table}</table></body></html>"
    )
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    with tmp.open("w") as f:
        f.write(page)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)  # a crash leaves the old report or the new one, never half of one
    return out

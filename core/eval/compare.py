"""``python -m core.eval compare A.jsonl B.jsonl``: per-prompt differences of two evaluations."""

from __future__ import annotations

import sys
from pathlib import Path

from core.errors import ConfigError
from core.eval.results import EvalRow, read_rows, summarize

__all__ = ["compare_main", "compare_rows"]


def _per_prompt(rows: list[EvalRow]) -> dict[int, tuple[str, float, int, int]]:
    """prompt -> (payload key, mean reward with failures as 0, passes, samples)."""
    out: dict[int, list[EvalRow]] = {}
    for row in rows:
        out.setdefault(row.prompt, []).append(row)
    return {
        p: (
            rs[0].payload_key,
            sum(float(r.reward) if r.ok and r.reward is not None else 0.0 for r in rs) / len(rs),
            sum(1 for r in rs if r.ok and r.reward is not None and r.reward >= 1.0),
            len(rs),
        )
        for p, rs in out.items()
    }


def compare_rows(a: list[EvalRow], b: list[EvalRow], *, names: tuple[str, str] = ("A", "B")) -> str:
    """A table of every prompt whose mean reward differs (largest change first), then totals.

    Raises:
        ConfigError: a prompt index holds different payloads in the two files (not the same eval set).
    """
    pa, pb = _per_prompt(a), _per_prompt(b)
    clash = [p for p in sorted(set(pa) & set(pb)) if pa[p][0] != pb[p][0]]
    if clash:
        raise ConfigError(
            f"prompt {clash[0]} (and {len(clash) - 1} more) holds a different payload in the two "
            "files: they did not evaluate the same eval set in the same order"
        )
    lines = [f"{'prompt':>6}  {names[0]:>8}  {names[1]:>8}  {'delta':>8}  pass {names[0]}/{names[1]}"]
    shared = sorted(set(pa) & set(pb), key=lambda p: (-abs(pb[p][1] - pa[p][1]), p))
    changed = 0
    for p in shared:
        delta = pb[p][1] - pa[p][1]
        if delta == 0 and pa[p][2] == pb[p][2]:
            continue
        changed += 1
        lines.append(
            f"{p:>6}  {pa[p][1]:>8.4f}  {pb[p][1]:>8.4f}  {delta:>+8.4f}  "
            f"{pa[p][2]}/{pa[p][3]} -> {pb[p][2]}/{pb[p][3]}"
        )
    for p in sorted(set(pa) ^ set(pb)):
        lines.append(f"{p:>6}  only in {names[0] if p in pa else names[1]}")
    better = sum(1 for p in shared if pb[p][1] > pa[p][1])
    worse = sum(1 for p in shared if pb[p][1] < pa[p][1])
    sa, sb = summarize(a), summarize(b)
    lines.append(
        f"{len(shared)} prompts in both: {better} better, {worse} worse, "
        f"{len(shared) - better - worse} unchanged ({changed} rows listed)"
    )
    n = min(sa["samples_per_prompt"], sb["samples_per_prompt"])
    for key in ("reward_mean", "pass@1", f"mean@{n}", "failed"):
        if key in sa and key in sb:
            lines.append(f"{key}: {sa[key]:.4f} -> {sb[key]:.4f} ({sb[key] - sa[key]:+.4f})")
    return "\n".join(lines)


def compare_main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m core.eval compare A/results.jsonl B/results.jsonl", file=sys.stderr)
        return 2
    try:
        a, b = read_rows(Path(argv[0])), read_rows(Path(argv[1]))
        print(compare_rows(a, b, names=("A", "B")))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0

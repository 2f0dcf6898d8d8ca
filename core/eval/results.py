"""Evaluation results: one ``EvalRow`` per rollout, the summary maths and the files.

``pass@k`` is the unbiased estimator of Chen et al. (2021): with ``n`` samples of
a prompt of which ``c`` pass, ``1 - C(n-c, k) / C(n, k)``, averaged over prompts.
A sample passes when it finished ``ok`` with ``reward >= pass_threshold``; a failed
rollout never passes and counts as reward 0 in ``mean@k`` (the mean reward of all
samples of a prompt, averaged over prompts), while ``reward_mean`` averages the
``ok`` rollouts only (as the training loop's ``eval/reward_mean`` always has),
and so do the ``reward/<component>`` means; failed rollouts are counted in ``failed``.

Several policies (docs/multi_agent.md): when the rows' turns come from more than one
policy, the summary also gives each policy's ``policy/<name>/reward`` (over the ``ok``
rollouts with a turn of it: its role reward when the agent returned one, else the
rollout's reward, as the training metrics of the same name), ``/rollouts`` and ``/turns``;
whenever agents return ``role_rewards``, each role's mean is ``role/<name>/reward`` (with
one shared policy too, so a shared policy's roles compare with a policy per role).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.types import RolloutStatus

__all__ = [
    "EvalRow",
    "k_values",
    "pass_at_k",
    "payload_key",
    "policy_summary",
    "read_rows",
    "summarize",
    "write_rows",
]


@dataclass
class EvalRow:
    """One evaluated rollout, as a line of ``results.jsonl``."""

    prompt: int
    """Index of the eval row (the prompt) in the eval set."""
    sample: int
    """Which of the prompt's ``samples_per_prompt`` samples this is."""
    payload_key: str
    """Short hash of the payload, so ``compare`` can tell that two files evaluated the same prompt."""
    status: str
    """The rollout's ``RolloutStatus`` value."""
    reward: float | None
    """The reward it trained or would train on (None unless ``ok``)."""
    rollout_id: str = ""
    """The rollout's id."""
    error: str | None = None
    """Why it failed, for failed rollouts."""
    prompt_tokens: int = 0
    """Prompt tokens of its trace rows (0 when no trace is captured: ``eval.endpoint``)."""
    generated_tokens: int = 0
    """Generated tokens of its trace rows (0 without trace capture)."""
    weight_version: int | None = None
    """Newest weight version that generated a token of it (None without trace capture)."""
    components: dict[str, float] = field(default_factory=dict)
    """Named reward components a reward plugin added (``reward/<name>`` in metrics)."""
    elapsed_s: float = 0.0
    """Wall time of the rollout."""
    policies: dict[str, int] = field(default_factory=dict)
    """Turns of each policy in its trace rows (empty without trace capture)."""
    role_rewards: dict[str, float] = field(default_factory=dict)
    """Per-role rewards the agent returned (``RolloutResult.role_rewards``; empty: none)."""

    @property
    def ok(self) -> bool:
        return self.status == RolloutStatus.OK.value


def payload_key(payload: dict[str, Any]) -> str:
    """A short, stable hash of a payload (keys sorted; ``_``-prefixed keys left out)."""
    clean = {k: v for k, v in payload.items() if not str(k).startswith("_")}
    text = json.dumps(clean, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from
    ``n`` (``c`` of them passing) passes."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    """The ``k`` reported for ``n`` samples per prompt: 1, 2, 4, ... up to ``n``, and ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    ks.append(n)
    return ks


def summarize(rows: Sequence[EvalRow], *, pass_threshold: float = 1.0) -> dict[str, Any]:
    """The summary of one evaluation: rewards, pass@k, mean@k, failures, tokens."""
    by_prompt: dict[int, list[EvalRow]] = {}
    for row in rows:
        by_prompt.setdefault(row.prompt, []).append(row)
    ok = [r.reward for r in rows if r.ok and r.reward is not None]
    statuses = Counter(r.status for r in rows)
    n = min((len(v) for v in by_prompt.values()), default=0)
    summary: dict[str, Any] = {
        "prompts": len(by_prompt),
        "rollouts": len(rows),
        "samples_per_prompt": n,
        "reward_mean": sum(ok) / len(ok) if ok else math.nan,
        "ok": statuses.get(RolloutStatus.OK.value, 0),
        "failed": len(rows) - statuses.get(RolloutStatus.OK.value, 0),
        "statuses": dict(sorted(statuses.items())),
        "pass_threshold": pass_threshold,
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "generated_tokens": sum(r.generated_tokens for r in rows),
    }
    if n:
        for k in k_values(n):
            passes = [
                pass_at_k(len(v), sum(1 for r in v if _passes(r, pass_threshold)), k)
                for v in by_prompt.values()
            ]
            summary[f"pass@{k}"] = sum(passes) / len(passes)
        means = [sum(_score(r) for r in v) / len(v) for v in by_prompt.values()]
        summary[f"mean@{n}"] = sum(means) / len(means)
    components: dict[str, list[float]] = {}
    for row in rows:
        if not row.ok:
            # A failed rollout's components (the agent's own reward/<name> metrics of a
            # rollout later excluded) say nothing valid: it is counted in ``failed``, as
            # ``reward_mean`` leaves it out (the training loop's component means do too).
            continue
        for name, value in row.components.items():
            components.setdefault(name, []).append(value)
    for name, values in sorted(components.items()):
        summary[f"reward/{name}"] = sum(values) / len(values)
    summary.update(policy_summary(rows))
    return summary


def policy_summary(rows: Sequence[EvalRow]) -> dict[str, float]:
    """``policy/<name>/*`` when the rows hold turns of several policies, and ``role/<name>/reward``
    when agents returned role rewards (module docstring); empty otherwise."""
    out: dict[str, float] = {}
    ok = [r for r in rows if r.ok and r.reward is not None]
    names = sorted({name for r in rows for name in r.policies})
    if len(names) > 1:
        for name in names:
            mine = [r for r in ok if r.policies.get(name)]
            rewards = [float(r.role_rewards.get(name, r.reward or 0.0)) for r in mine]
            out[f"policy/{name}/reward"] = sum(rewards) / len(rewards) if rewards else math.nan
            out[f"policy/{name}/rollouts"] = float(len(mine))
            out[f"policy/{name}/turns"] = float(sum(r.policies.get(name, 0) for r in mine))
    roles: dict[str, list[float]] = {}
    for row in ok:
        for name, value in row.role_rewards.items():
            roles.setdefault(name, []).append(float(value))
    for name, values in sorted(roles.items()):
        out[f"role/{name}/reward"] = sum(values) / len(values)
    return out


def _passes(row: EvalRow, threshold: float) -> bool:
    return row.ok and row.reward is not None and row.reward >= threshold


def _score(row: EvalRow) -> float:
    return float(row.reward) if row.ok and row.reward is not None else 0.0


def write_rows(path: Path, rows: Sequence[EvalRow]) -> None:
    """Write ``rows`` as JSONL (one object per rollout)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(asdict(row)) + "\n")


def read_rows(path: Path) -> list[EvalRow]:
    """Read a ``results.jsonl`` written by ``write_rows``; a bad line raises ``ConfigError``."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; pass the results.jsonl that python -m core.eval wrote")
    names = set(EvalRow.__dataclass_fields__)
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            rows.append(EvalRow(**{k: v for k, v in data.items() if k in names}))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ConfigError(
                f"{path}:{number} is not a row of python -m core.eval's results.jsonl ({exc})"
            ) from exc
    return rows

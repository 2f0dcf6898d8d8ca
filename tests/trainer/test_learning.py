"""The embedded default really learns, and would not if the maths were wrong.

A shortened ``python -m core.train`` (local torch backend, tiny model built
from the seed, agent processes under the local runtime, real gateway) must
lift the mean reward from near zero (a random policy scores about 0.002 on
succ_digit) far above it. Each sabotaged variant breaks one thing a silent
bug could break: the advantage sign, the loss mask, the logprobs the ratio
is computed against, or the weight sync. None of them may learn in the same
number of steps. The prototype in shared/research/toy-task.md saw every such
sabotage stay below 0.15 while healthy runs passed 0.9.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import core.trainer.loop as loop
from core.plugins import load_plugins
from core.testing.fakes import compose
from core.trainer.loop import Trainer
from core.trainer.metrics import read_metrics

STEPS = 250
"""The default run (seed 0; runs are reproducible) passes 0.8 near step 200."""
WINDOW = 10


def _train(tmp_path: Path, *overrides: str) -> list[dict[str, Any]]:
    plugins = load_plugins()
    cfg = compose(
        [
            f"run_dir={tmp_path / 'run'}",
            f"trainer.max_steps={STEPS}",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            "seed=0",
            *overrides,
        ],
        plugins,
    )
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    return [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _final(records: list[dict[str, Any]]) -> float:
    return _mean([r["reward/mean"] for r in records[-WINDOW:]])


@pytest.mark.slow
def test_default_task_learns_far_above_baseline(tmp_path: Path) -> None:
    records = _train(tmp_path)
    assert len(records) == STEPS
    baseline = _mean([r["reward/mean"] for r in records[:WINDOW]])
    final = _final(records)
    print(f"baseline {baseline:.3f} -> final {final:.3f}")
    assert baseline < 0.05
    assert final >= 0.6 and final - baseline >= 0.5
    gaps = [r["train/logprob_diff_max"] for r in records if not math.isnan(r["train/logprob_diff_max"] or math.nan)]
    assert gaps and max(gaps) < 1e-3  # sampler and trainer agree: same weights, same temperature


def _negate_advantages(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    real = loop.compute_group_advantages

    def negated(*args: Any, **kwargs: Any) -> Any:
        stats = real(*args, **kwargs)
        stats.advantages = {k: -v for k, v in stats.advantages.items()}
        return stats

    monkeypatch.setattr(loop, "compute_group_advantages", negated)
    return []


def _shift_mask(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The loss mask one token late: the first generated token is never trained."""
    real = loop.trace_to_datum

    def shifted(record: Any, advantage: float) -> Any:
        datum = real(record, advantage)
        if datum is None:
            return None
        weights = [0.0, *datum.weights[:-1]]
        return replace(datum, weights=weights, advantages=[advantage * w for w in weights])

    monkeypatch.setattr(loop, "trace_to_datum", shifted)
    return []


def _mismatched_logprobs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Sampler logprobs at T=1, trainer logprobs at T=0.7: ratios far from 1, clipped away."""
    return ["+algorithm.loss_config.temperature=0.7"]


def _no_weight_sync(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sampler keeps serving the initial weights."""
    from tracerl_local.backend import LocalBackend

    async def stale(self: Any) -> Any:
        return self.sampler

    monkeypatch.setattr(LocalBackend, "sync_sampler", stale)
    return []


@pytest.mark.slow
@pytest.mark.parametrize(
    "sabotage", [_negate_advantages, _shift_mask, _mismatched_logprobs, _no_weight_sync],
    ids=["negated-advantages", "shifted-mask", "mismatched-logprobs", "no-weight-sync"],
)
def test_sabotaged_variants_do_not_learn(
    sabotage: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = sabotage(monkeypatch)
    records = _train(tmp_path, *overrides)
    final = _final(records)
    print(f"{sabotage.__name__}: final {final:.3f}")
    assert final < 0.3

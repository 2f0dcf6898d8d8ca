"""The multi-turn lookup task learns through the real gateway and tool parser, and would
not if the second turn went untrained.

A shortened ``python -m core.train task=lookup`` (local backend, tiny model from the
seed, the task's agent on the official openai SDK in local-runtime processes, real
gateway and Hermes tool parser) must lift the mean reward far above the no-tool
baseline: a rollout without a well-formed ``lookup`` call scores 0.0, so 0.0 is the
best a policy that never calls the tool can reach (core/tasks/lookup.py states the
shaped reward in full). The healthy run starts from random weights and, by ``STEPS``,
calls the tool in nearly every rollout and answers in the second turn with a digit.

What is asserted is what every measured run reached within this budget (the call,
then the answer's form); reading the value out of the tool result comes later and at
a step that varies between runs (docs/quickstart.md has the figures), so it is
reported, not asserted.

Sabotage, as in test_learning.py (cheap: it resumes from the healthy run's checkpoint
at ``RESUME_AT``, where calls are being found and the second turn is still random,
and runs to ``STEPS``): ``second-turn-untrained`` gives every turn after a row's first
no weight, so the answer after the tool result is never trained. It learns the call
(turn one) but its answers keep the form they had; the healthy run's do not.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from core.trainer.checkpoint import STATE_FILE, checkpoint_dir
from core.trainer.metrics import read_metrics
from core.trainer.traces import read_traces, trace_path

pytestmark = pytest.mark.long
"""Minutes of training: outside README's ``python -m pytest``; ``python -m pytest -m long`` runs it (CI does)."""

RUNNER = Path(__file__).with_name("learning_run.py")
SEED = 0
STEPS = 120
"""Where every measured run calls the tool and answers with a digit (reward about 0.3)."""
RESUME_AT = 50
"""Where the sabotaged run starts: calls are being found, answers are still random."""
WINDOW = 10
MIN_FINAL = 0.25
"""Healthy mean reward over the last ``WINDOW`` steps (runs measured here: 0.28-0.30;
a call alone earns 0.2, a call and a digit answer 0.3)."""
SABOTAGES = ["second-turn-untrained"]
TASK = ["task=lookup", "trainer.eval_every=0"]
Records = list[dict[str, Any]]


def window_mean(records: Records, end: int) -> float:
    """Mean reward of the ``WINDOW`` steps ending at step ``end``."""
    by_step = {int(r["step"]): r["reward/mean"] for r in records}
    values = [by_step[s] for s in range(end - WINDOW + 1, end + 1)]
    return sum(values) / len(values)


def _run(variant: str, run_dir: Path, log: Path, *overrides: str) -> tuple[Records, float]:
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, str(RUNNER), variant, str(run_dir), f"seed={SEED}", *TASK, *overrides],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    assert proc.returncode == 0, f"{variant} run failed (exit {proc.returncode}):\n{log.read_text()[-3000:]}"
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    return records, time.perf_counter() - start


def _sabotaged(variant: str, root: Path, healthy: Future[tuple[Records, float]]) -> tuple[Records, float]:
    ckpt = checkpoint_dir(root / "none", RESUME_AT)
    while not (ckpt / STATE_FILE).is_file():
        if healthy.done():
            healthy.result()  # raises if the healthy run failed
            raise AssertionError(f"the healthy run finished without writing {ckpt}")
        time.sleep(1.0)
    run_dir = root / variant
    shutil.copytree(ckpt, checkpoint_dir(run_dir, RESUME_AT))
    return _run(variant, run_dir, root / f"{variant}.log", f"trainer.max_steps={STEPS}", "trainer.resume=true")


def answer_share(run_dir: Path, steps: range, metric: str = "answer_is_digit") -> float:
    """Mean of the agent's 0/1 ``metric`` over the rollouts of ``steps``."""
    hits = [
        rollout["metrics"][metric]
        for step in steps
        for rollout in read_traces(trace_path(run_dir, "train", step)).rollouts
        if rollout["metrics"]
    ]
    return sum(hits) / len(hits)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lookup_learning")


@pytest.fixture(scope="module")
def runs(root: Path) -> dict[str, Records]:
    with ThreadPoolExecutor(max_workers=1 + len(SABOTAGES)) as pool:  # 2 processes on 2 cores
        healthy = pool.submit(
            _run, "none", root / "none", root / "none.log",
            f"trainer.max_steps={STEPS}", f"trainer.save_every={RESUME_AT}",
        )
        futures = {"none": healthy, **{s: pool.submit(_sabotaged, s, root, healthy) for s in SABOTAGES}}
        results = {variant: f.result() for variant, f in futures.items()}
    for variant, (records, wall) in results.items():
        print(f"{variant}: {len(records)} steps in {wall:.0f} s, final {window_mean(records, STEPS):.3f}")
    return {variant: records for variant, (records, _) in results.items()}


@pytest.mark.slow
def test_lookup_learns_far_above_the_no_tool_baseline(runs: dict[str, Records], root: Path) -> None:
    records = runs["none"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    start, final = window_mean(records, WINDOW), window_mean(records, STEPS)
    digit = answer_share(root / "none", _last(STEPS))
    right = answer_share(root / "none", _last(STEPS), "answer_starts_right")
    print(
        f"no-tool baseline 0.0; first steps {start:.3f} -> final {final:.3f}; "
        f"answers a digit {digit:.2f}, the looked-up one {right:.2f} (chance 0.25)"
    )
    assert start < 0.1
    assert final >= MIN_FINAL  # far above 0.0, and above what the call alone earns
    last = {int(r["step"]): r for r in records}[STEPS]
    assert last["turns/total"] >= 1.8 * last["rollouts/total"]  # nearly every rollout calls, then answers
    assert digit >= 0.8  # the second turn learned the answer's form
    assert last["train/logprob_diff_max"] < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sabotage", SABOTAGES)
def test_untrained_second_turn_does_not_learn_the_answer(
    sabotage: str, runs: dict[str, Records], root: Path
) -> None:
    records = runs[sabotage]
    assert [r["step"] for r in records] == list(range(RESUME_AT + 1, STEPS + 1))  # resumed
    start_digit = answer_share(root / "none", _last(RESUME_AT))
    healthy_digit = answer_share(root / "none", _last(STEPS))
    digit = answer_share(root / sabotage, _last(STEPS))
    healthy, final = window_mean(runs["none"], STEPS), window_mean(records, STEPS)
    print(
        f"{sabotage}: answers a digit {start_digit:.2f} at step {RESUME_AT} -> {digit:.2f} at {STEPS} "
        f"(healthy {healthy_digit:.2f}); reward {final:.3f} (healthy {healthy:.3f})"
    )
    # From the same checkpoint the healthy run learned the answer's form; this one did not.
    assert healthy_digit >= 0.8 and start_digit < 0.5
    assert digit < 0.5 and digit < healthy_digit - 0.4
    assert final < healthy - 0.04 and final < 0.24  # the call's 0.2, little more


def _last(step: int) -> range:
    return range(step - WINDOW + 1, step + 1)

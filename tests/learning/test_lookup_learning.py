"""The multi-turn lookup task learns through the real gateway and tool parser to read the
value out of the tool result, and would not if the second turn went untrained or the tool
result were trained as if the model had generated it.

A shortened ``python -m core.train task=lookup`` (local backend, tiny model from the
seed, the task's agent on the official openai SDK in local-runtime processes, real
gateway and Hermes tool parser) must lift the mean reward far above the no-tool
baseline: a rollout without a well-formed ``lookup`` call scores 0.0, so 0.0 is the
best a policy that never calls the tool can reach (core/tasks/lookup.py states the
shaped reward in full). The value is drawn per row from 4 digits, so an answer that
does not read the tool result is right 1 time in 4: the healthy run, from random
weights, must by ``STEPS`` answer the looked-up value in far more rollouts than that
(``MIN_RIGHT``; margins from the runs in docs/quickstart.md).

Sabotages, as in test_learning.py (cheap: each resumes from the healthy run's
checkpoint at ``RESUME_AT``, where calls are being found and the answers are not yet
digits, and runs to ``STEPS``):

- ``second-turn-untrained`` gives every turn after a row's first no weight, so the
  answer after the tool result is never trained: it learns the call (turn one) but
  its answers keep the random form they had.
- ``tool-result-trained`` gives the tokens between the turns (the tool result and the
  template around it) loss weight 1, as a gateway that recorded them as generated
  would (with the 0.0 sampler logprob the row holds there). It is not fatal here: the
  repeated value in the tool result is itself a copy to learn, so the answers still
  learn to read it, mostly more slowly but not reliably so (measured right at step 150:
  seed 0 0.44, 0.17 and 0.66 in three runs against the healthy 0.72; seed 1 0.46 against
  0.99). So the test asserts what does hold: the run's own ``train/logprob_diff_max`` flags
  it (about 7 nats against the healthy run's < 1e-3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from core.rundir.checkpoint import STATE_FILE, checkpoint_dir
from core.rundir.metrics import read_metrics
from core.rundir.traces import read_traces, trace_path

pytestmark = [pytest.mark.long, pytest.mark.timeout(1800)]
"""Minutes of training: outside README's ``python -m pytest``; ``python -m pytest -m long`` runs it
(CI does). Three runs at once (about 6 minutes of CPU): on a 2-core machine shared with other
work they took 9.5 and 13 minutes, past the suite's 600 s per test."""

RUNNER = Path(__file__).with_name("learning_run.py")
ROOT = Path(__file__).resolve().parents[2]
"""The checkout under test: first on the runs' ``sys.path`` (the runner's own folder comes
first otherwise, then whatever ``core`` the environment has installed)."""
SEED = 0
STEPS = 150
"""Where every measured run answers the looked-up value in most rollouts."""
RESUME_AT = 50
"""Where the sabotaged runs start: calls are being found, answers are still mostly not digits."""
WINDOW = 10
CHANCE = 0.25
"""Share of right answers for a policy that answers a digit without reading the result."""
MIN_RIGHT = 0.45
"""Healthy share of answers that are the looked-up value over the last ``WINDOW`` steps
(runs measured here, seeds 0-4: 0.62-0.99 at step 150; chance 0.25)."""
MIN_FINAL = 0.5
"""Healthy mean reward over the last ``WINDOW`` steps (runs measured here, seeds 0-4: 0.69-1.00 at step 150;
a call and a digit that does not read the result earn 0.4 on average)."""
SABOTAGES = ["second-turn-untrained", "tool-result-trained"]
TASK = ["task=lookup", "trainer.eval_every=0", "trainer.keep_traces=0"]
"""keep_traces=0: the test reads the traces of steps 41-50 after step 150 is written."""
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
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
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
    with ThreadPoolExecutor(max_workers=1 + len(SABOTAGES)) as pool:  # the sabotages start at RESUME_AT
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
def test_lookup_learns_to_answer_the_looked_up_value(runs: dict[str, Records], root: Path) -> None:
    records = runs["none"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    start, final = window_mean(records, WINDOW), window_mean(records, STEPS)
    digit = answer_share(root / "none", _last(STEPS))
    right = answer_share(root / "none", _last(STEPS), "answer_starts_right")
    print(
        f"no-tool baseline 0.0; first steps {start:.3f} -> final {final:.3f}; "
        f"answers a digit {digit:.2f}, the looked-up one {right:.2f} (chance {CHANCE})"
    )
    assert start < 0.1
    assert final >= MIN_FINAL  # far above 0.0, and above what a call and a guessed digit earn
    last = {int(r["step"]): r for r in records}[STEPS]
    assert last["turns/total"] >= 1.8 * last["rollouts/total"]  # nearly every rollout calls, then answers
    assert digit >= 0.9  # the second turn learned the answer's form
    assert right >= MIN_RIGHT  # ... and reads it out of the tool result: chance is 0.25
    assert last["train/logprob_diff_max"] < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sabotage", SABOTAGES)
def test_each_sabotage_is_caught(
    sabotage: str, runs: dict[str, Records], root: Path
) -> None:
    records = runs[sabotage]
    assert [r["step"] for r in records] == list(range(RESUME_AT + 1, STEPS + 1))  # resumed
    start_right = answer_share(root / "none", _last(RESUME_AT), "answer_starts_right")
    healthy_right = answer_share(root / "none", _last(STEPS), "answer_starts_right")
    digit = answer_share(root / sabotage, _last(STEPS))
    right = answer_share(root / sabotage, _last(STEPS), "answer_starts_right")
    healthy, final = window_mean(runs["none"], STEPS), window_mean(records, STEPS)
    gap = max(r["train/logprob_diff_max"] for r in records)
    print(
        f"{sabotage}: right answers {start_right:.2f} at step {RESUME_AT} -> {right:.2f} at {STEPS} "
        f"(healthy {healthy_right:.2f}); digits {digit:.2f}; reward {final:.3f} (healthy {healthy:.3f}); "
        f"largest sampler/trainer logprob gap {gap:.3g}"
    )
    # From the same checkpoint the healthy run learned to read the result.
    assert start_right < 0.15 and healthy_right >= MIN_RIGHT
    if sabotage == "second-turn-untrained":
        # The answer is never trained: no better than chance, far below the healthy run
        # (measured 0.09-0.12 right, reward 0.28-0.29).
        assert right < CHANCE + 0.05 and right < healthy_right - 0.3
        assert final < healthy - 0.3
    else:
        # Trained on tokens it never sampled. Its copy is mostly slower (measured 0.17-0.66
        # against the healthy runs of seeds 0 and 1, 0.72 and 0.99, at step 150) but not by
        # a margin that holds from run to run (seeded runs repeat closely, not bit for bit),
        # so only the flag is asserted:
        # the tool result has no sampler logprob, so trainer and sampler disagree there by nats.
        assert gap > 1.0
    assert max(r["train/logprob_diff_max"] for r in runs["none"]) < 1e-3


def _last(step: int) -> range:
    return range(step - WINDOW + 1, step + 1)

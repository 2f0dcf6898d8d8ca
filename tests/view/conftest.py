"""One short real training run shared by the viewer tests.

``python -m core.train`` with the local backend and the default toy task, 3 steps
of 4 prompts x 4 rollouts, an eval set of 4 prompts, and an agent that crashes
on the rows marked ``fail`` (one of the ten prompts), so the run has failed
rollouts to show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("view_run")
    train, evals = base / "train.jsonl", base / "eval.jsonl"
    with train.open("w") as f:
        for n in range(10):
            f.write(json.dumps({"payload": {"n": n, "answer": str((n + 1) % 10), "fail": n == 5}}) + "\n")
    with evals.open("w") as f:
        for n in range(4):
            f.write(json.dumps({"payload": {"n": n, "answer": str((n + 1) % 10)}}) + "\n")
    run_dir = base / "run"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [
            sys.executable, "-m", "core.train",
            f"run_dir={run_dir}",
            "trainer.max_steps=3", "trainer.batch_size=4", "trainer.group_size=4",
            "trainer.progress=false", "trainer.eval_every=0", "trainer.save_every=0",
            f"task.train_path={train}", f"task.eval_path={evals}",
            "task.agent=view_agents:app", f"+task.agent_env.PYTHONPATH={HERE}",
            "runtime.num_processes=1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"run_dir": run_dir, "stdout": proc.stdout}

"""``kill -9`` of the trainer process while it writes a checkpoint, then resume; and a
newest checkpoint whose backend files are empty, torn or missing (issue #29).

A run in a subprocess (``ckpt_run.py``: ``Trainer``, fake backend, real gateway
and agent process) saves every 2 steps; its backend's save for step 4 stalls after
writing its files, and the test SIGKILLs the process there. Resuming in the same
``run_dir`` must start from the last complete checkpoint (step 2, not the torn
step 4), replay steps 3 to 5 on the same data as an uninterrupted run, and count
each step once in the metrics and the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.agent._reap import descendants
from core.rundir import checkpoint as ckpt
from core.rundir.checkpoint import STATE_FILE, latest_checkpoint
from core.rundir.metrics import read_metrics
from tests.faults.harness import HERE, fault_config, fault_overrides, run_loop
from tests.rundir.test_run_dir import _save_with_backend

STEPS = ("trainer.max_steps=5", "trainer.save_every=2")


def _kill_during_checkpoint(tmp: Path) -> None:
    mark = tmp / "saving"
    env = {**os.environ, "FAULT_HANG_SAVE_STEP": "4", "FAULT_MARK": str(mark)}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ckpt_run.py"), *fault_overrides(tmp, *STEPS)],
        cwd=HERE.parent.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    agents: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None, f"the run ended before the checkpoint: {proc.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint write within 120 s"
            time.sleep(0.05)
        agents = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        # The agent processes notice the dead trainer and exit on their own
        # (tests/runtime/local/test_orphans.py); don't leave one behind if that is slow.
        for pid in agents:
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_kill_during_checkpoint_then_resume_from_the_last_complete_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full_cfg, plugins = fault_config(tmp_path / "full", *STEPS)
    assert run_loop(full_cfg, plugins)[0] == 0
    full = {r["step"]: r for r in read_metrics(Path(str(full_cfg.run_dir)) / "metrics.jsonl") if "data/batch" in r}

    split = tmp_path / "split"
    _kill_during_checkpoint(split)
    run_dir = split / "run"
    torn = run_dir / "checkpoints" / "step_000004"
    assert (torn / "backend" / "fake.json").exists() and not (torn / STATE_FILE).exists()
    last = latest_checkpoint(run_dir)
    assert last is not None and last.step == 2
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "data/batch" in r] == [1, 2, 3], "step 3 was logged, then lost"

    cfg, plugins = fault_config(split, *STEPS, "trainer.resume=true")
    capsys.readouterr()
    code, backend = run_loop(cfg, plugins)
    assert code == 0
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000002'} at step 2" in capsys.readouterr().err
    assert (torn / STATE_FILE).exists(), "step 4 saved again, complete this time"

    raw = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in raw if "data/batch" in r] == [1, 2, 3, 3, 4, 5]
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "data/batch" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5], "each step counts once"
    assert [r["data/batch"] for r in records] == [full[s]["data/batch"] for s in range(1, 6)]
    assert [r["data/cursor"] for r in records] == [full[s]["data/cursor"] for s in range(1, 6)]
    # the report's reward curve has one point per step
    report = (run_dir / "report.html").read_text()
    train_curve = report.split('<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="')[1]
    assert len(train_curve.split('"')[0].split()) == 5
    assert "<td>steps</td><td>5</td>" in report


@pytest.mark.parametrize("damage", ["empty", "torn", "missing", "empty, written before sizes were recorded"])
def test_resume_falls_back_past_a_checkpoint_whose_backend_state_is_empty_or_torn(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """#29: an empty state.pt in the newest checkpoint crashed resume with EOFError."""
    _save_with_backend(tmp_path, 2)
    newest = _save_with_backend(tmp_path, 4)
    state_pt = newest / "backend" / "state.pt"
    if damage == "torn":
        state_pt.write_bytes(b"weights" * 50)
    elif damage == "missing":
        state_pt.unlink()
    else:
        state_pt.write_bytes(b"")
    if damage.startswith("empty, written before"):
        state = json.loads((newest / "trainer_state.json").read_text())
        del state[ckpt.BACKEND_FILES]
        (newest / "trainer_state.json").write_text(json.dumps(state))
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.step == 2
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "step_000004" in err and "state.pt" in err

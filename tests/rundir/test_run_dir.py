"""A run directory survives crashes, resumes and neighbours (#15.11): durable
checkpoints with a fallback, one run per directory, metrics that tolerate a torn
line and count replayed steps once."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from core.rundir import checkpoint as ckpt
from core.rundir.checkpoint import (
    RunDirLock,
    checkpoint_dir,
    existing_checkpoints,
    latest_checkpoint,
    write_trainer_state,
)
from core.rundir.metrics import MetricsWriter, read_metrics
from core.rundir.report import write_report


def _save(run_dir: Path, step: int) -> Path:
    path = checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    write_trainer_state(path, {"step": step, "data": {"cursor": step}, "backend_path": str(path / "backend")})
    return path


def test_state_is_fsynced_before_the_rename_that_publishes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(f"replace {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "fsync", fsync)
    monkeypatch.setattr(ckpt.os, "replace", replace)
    _save(tmp_path, 3)
    assert events == ["fsync", "replace trainer_state.json", "fsync"]  # data, rename, directory
    assert json.loads((checkpoint_dir(tmp_path, 3) / "trainer_state.json").read_text())["step"] == 3


@pytest.mark.parametrize("damage", ['{"step": 4, "data"', "[]", '{"data": {}, "backend_path": "x"}', ""])
def test_latest_checkpoint_falls_back_past_an_unreadable_newest(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    (newest / "trainer_state.json").write_text(damage)
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.step == 2
    assert "step_000004" in capsys.readouterr().err


def _save_with_backend(run_dir: Path, step: int) -> Path:
    path = checkpoint_dir(run_dir, step)
    (path / "backend").mkdir(parents=True)
    (path / "backend" / "state.pt").write_bytes(b"weights" * 100)
    (path / "backend" / "meta.json").write_text("{}")
    write_trainer_state(path, {"step": step, "data": {"cursor": step}, "backend_path": str(path / "backend")})
    return path


def test_backend_files_are_fsynced_and_sized_before_the_state_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(ckpt.os, "fsync", fsync)
    path = _save_with_backend(tmp_path, 3)
    assert len(synced) >= 5  # two backend files, their folder, the state file, the checkpoint folder
    state = json.loads((path / "trainer_state.json").read_text())
    assert state[ckpt.BACKEND_FILES] == {"meta.json": 2, "state.pt": 700}
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.step == 3


def test_a_remote_backend_path_is_not_checked_on_disk(tmp_path: Path) -> None:
    path = checkpoint_dir(tmp_path, 5)
    path.mkdir(parents=True)
    write_trainer_state(path, {"step": 5, "data": {}, "backend_path": "tinker://run/weights/5"})
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.step == 5 and ckpt.BACKEND_FILES not in found.state


def test_latest_checkpoint_picks_the_highest_readable_step(tmp_path: Path) -> None:
    for step in (10, 2, 30):
        _save(tmp_path, step)
    (tmp_path / "checkpoints" / "step_000040").mkdir()  # killed mid-save: no state file
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.step == 30
    assert [p.name for p in existing_checkpoints(tmp_path)] == ["step_000002", "step_000010", "step_000030"]


def test_one_run_per_run_dir(tmp_path: Path) -> None:
    first = RunDirLock(tmp_path)
    with pytest.raises(ConfigError, match=rf"run_dir {re.escape(str(tmp_path))} is in use.*pid {os.getpid()}"):
        RunDirLock(tmp_path)
    first.release()
    RunDirLock(tmp_path).release()  # free again once the first run ended


# -- metrics.jsonl ------------------------------------------------------------------------


def _lines(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_read_metrics_ignores_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines({"step": 1}, {"step": 2}) + '{"step": 3, "reward/me')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_read_metrics_names_a_damaged_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines({"step": 1}) + "garbage\n" + _lines({"step": 2}))
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a JSON record"):
        read_metrics(path)


def test_a_reopened_writer_cuts_the_torn_tail_instead_of_appending_to_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines({"step": 1}) + '{"step": 2, "rew')
    writer = MetricsWriter(tmp_path, ["jsonl"], config={})
    writer.write({"step": 2, "reward/mean": 0.5})
    writer.close()
    assert read_metrics(path) == [{"step": 1}, {"step": 2, "reward/mean": 0.5}]


def test_steps_replayed_after_a_resume_count_once(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, ["jsonl"], config={})
    for step in range(1, 6):  # the first run logs 5 steps, its last checkpoint is at step 2
        writer.write({"step": step, "reward/mean": 0.0})
    writer.close()
    writer = MetricsWriter(tmp_path, ["jsonl"], config={})
    writer.mark_resume(2)
    for step in range(3, 7):  # the resumed run replays 3..5 and goes on to 6
        writer.write({"step": step, "reward/mean": 1.0})
    writer.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["reward/mean"] for r in records] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    page = write_report(tmp_path).read_text()
    # the mean of the last five steps uses one copy of each: (0 + 1 * 4) / 5
    assert "<td>train reward, mean of last 5 steps</td><td>0.800</td>" in page
    assert "<td>steps</td><td>6</td>" in page
    train_curve = re.search(r'<polyline[^>]*points="([^"]*)"', page)
    assert train_curve is not None and len(train_curve.group(1).split()) == 6  # one point per step


def test_the_report_counts_tool_calls_that_failed_to_parse_when_tools_were_offered(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, ["jsonl"], config={})
    writer.write({"step": 1, "reward/mean": 0.0, "gateway/turns_with_tools": 0.0, "gateway/parse/no_tools": 8.0})
    writer.close()
    assert "failed to parse" not in write_report(tmp_path).read_text()  # no tools offered: no line
    writer = MetricsWriter(tmp_path, ["jsonl"], config={})
    writer.write({"step": 2, "reward/mean": 0.0, "gateway/turns_with_tools": 8.0, "gateway/parse/calls": 5.0,
                  "gateway/parse/bad_json": 2.0, "gateway/parse/unknown_tool": 1.0})
    writer.write({"step": 3, "reward/mean": 0.0, "gateway/turns_with_tools": 2.0, "gateway/parse/calls": 2.0})
    writer.close()
    page = write_report(tmp_path).read_text()
    want = "<td>tool calls that failed to parse</td><td>3 of 10 turns with tools (30.0%): 1 unknown_tool, 2 bad_json</td>"
    assert want in page, page


def test_each_metrics_record_is_fsynced_and_the_report_replaced_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import core.rundir.metrics as metrics_module
    import core.rundir.report as report_module

    synced: list[int] = []
    monkeypatch.setattr(metrics_module.os, "fsync", lambda fd: synced.append(fd))
    writer = MetricsWriter(tmp_path, ["jsonl"], config={})
    writer.write({"step": 1, "reward/mean": 0.5})
    writer.write({"step": 2, "reward/mean": 0.6})
    writer.close()
    assert len(synced) == 2
    replaced: list[str] = []
    real_replace = os.replace
    monkeypatch.setattr(report_module.os, "replace", lambda a, b: (replaced.append(Path(b).name), real_replace(a, b)))
    out = write_report(tmp_path)
    assert replaced == ["report.html"] and out.read_text().startswith("<!doctype html>")
    assert not list(tmp_path.glob("*.tmp"))


def test_prune_keeps_the_newest_and_the_chosen_and_leaves_incomplete_ones(tmp_path: Path) -> None:
    from core.rundir.checkpoint import prune_checkpoints

    for step in (1, 2, 3, 4, 5):
        _save_with_backend(tmp_path, step)
    unfinished = checkpoint_dir(tmp_path, 6)
    (unfinished / "backend").mkdir(parents=True)  # a save under way: no state file yet
    deleted = prune_checkpoints(tmp_path, keep_last=2, keep_steps={2})
    assert [p.name for p in deleted] == ["step_000001", "step_000003"]
    assert [p.name for p in existing_checkpoints(tmp_path)] == ["step_000002", "step_000004", "step_000005"]
    assert unfinished.is_dir()
    assert prune_checkpoints(tmp_path, keep_last=0) == []  # 0 keeps all
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.step == 5

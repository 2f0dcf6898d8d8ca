"""A run directory carries its config (#30): resume and eval from the run directory alone,
a refused resume that leaves the directory as it was, and the override rules behind them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from core.rundir.runconfig import (
    RUN_FILE,
    RunRecord,
    read_run_record,
    resume_overrides,
    reuse_overrides,
    run_dir_of,
)

ROOT = Path(__file__).resolve().parents[2]

AGENT = '''
import os
from pathlib import Path

from core.agent import AgentApp
from core.tasks.succ_digit import solve

app = AgentApp()


@app.entrypoint
async def run(payload):
    with Path(os.environ["MY_AGENT_LOG"]).open("a") as f:
        f.write("called\\n")
    return await solve(payload)
'''


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    paths = [str(ROOT), str(ROOT / "plugins" / "local"), os.environ.get("PYTHONPATH", "")]
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
    )


def _snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under ``run_dir`` by relative path, with its content's hash."""
    return {
        p.relative_to(run_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.mark.integration
def test_resume_and_eval_need_only_the_run_directory(tmp_path: Path) -> None:
    """A custom agent on a tiny model of its own shape: resume and eval repeat no override."""
    (tmp_path / "my_agent.py").write_text(AGENT)
    log = tmp_path / "agent.log"
    run_dir = tmp_path / "run"
    fresh = _cli(
        "core.train", f"run_dir={run_dir}", "task.agent=my_agent:app", f"+task.agent_env.PYTHONPATH={tmp_path}",
        f"+task.agent_env.MY_AGENT_LOG={log}", "backend.tiny.hidden_size=32", "task.tokenizer_vocab_size=120",
        "trainer.max_steps=2", "trainer.save_every=1", "trainer.batch_size=2", "trainer.group_size=2",
        "trainer.eval_size=2", "trainer.progress=false", "runtime.num_processes=1",
        cwd=tmp_path,
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    record = read_run_record(run_dir)
    assert record is not None and record.path.name == RUN_FILE
    assert "task.agent=my_agent:app" in record.overrides
    assert record.config["backend"]["tiny"]["hidden_size"] == 32 and record.choices["backend"] == "local"
    before = _snapshot(run_dir)

    # Refused: it would change what the run trains. Nothing in the run directory changes.
    refused = _cli("core.train", f"run_dir={run_dir}", "trainer.resume=true", "algorithm.learning_rate=0.5",
                   "trainer.max_steps=3", cwd=tmp_path)
    assert refused.returncode == 2
    assert "algorithm.learning_rate=0.5 (the run has " in refused.stderr
    assert "start a new run_dir" in refused.stderr and "Traceback" not in refused.stderr
    assert _snapshot(run_dir) == before

    # Resumed with nothing but the run directory (and a longer budget, which a resume may change).
    resumed = _cli("core.train", f"run_dir={run_dir}", "trainer.resume=true", "trainer.max_steps=3",
                   "trainer.batch_size=2", cwd=tmp_path)  # repeating the run's own value is fine
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "step_000002" in resumed.stderr
    after = _snapshot(run_dir)
    for name in (".hydra/overrides.yaml", ".hydra/config.yaml"):  # how the run started is kept
        assert after[name] == before[name]
    record = read_run_record(run_dir)
    assert record is not None and record.resumes == [[f"run_dir={run_dir}", "trainer.resume=true",
                                                       "trainer.max_steps=3", "trainer.batch_size=2"]]
    assert (run_dir / "checkpoints" / "step_000003").is_dir()

    # Evaluated from a checkpoint alone: the model's shape, the tokenizer and the agent come from the run.
    calls = log.read_text().count("called")
    out = tmp_path / "eval"
    ev = _cli("core.eval", f"eval.checkpoint={run_dir / 'checkpoints' / 'step_000002'}", "eval.limit=2",
              "eval.progress=false", f"eval.output_dir={out}", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["failed"] == 0
    assert log.read_text().count("called") == calls + 2  # the run's own agent ran them

    # An override that changes the model's shape gets a hint, not only torch's size mismatch.
    bad = _cli("core.eval", f"eval.checkpoint={run_dir}", "eval.limit=1", "eval.progress=false",
               "backend.tiny.hidden_size=64", f"eval.output_dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert bad.returncode == 1
    assert "It was trained with other settings" in bad.stderr and RUN_FILE in bad.stderr


def test_a_resume_without_a_checkpoint_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    empty = tmp_path / "run"
    empty.mkdir()
    proc = _cli("core.train", f"run_dir={empty}", "trainer.resume=true", cwd=tmp_path)
    assert proc.returncode == 2 and "holds no complete checkpoint" in proc.stderr
    assert list(empty.iterdir()) == []
    proc = _cli("core.train", "trainer.resume=true", cwd=tmp_path)
    assert proc.returncode == 2 and "needs run_dir=" in proc.stderr
    assert not (tmp_path / "outputs").exists()


def _record() -> RunRecord:
    return RunRecord(
        overrides=["task=lookup", "run_dir=/r", "algorithm.learning_rate=0.01", "+task.agent_env.X=1"],
        config={"seed": 0, "trainer": {"batch_size": 16}, "algorithm": {"learning_rate": 0.01}},
        choices={"task": "lookup", "backend": "local"},
    )


def test_resume_overrides_apply_allowed_keys_and_repeats_and_refuse_the_rest() -> None:
    merged = resume_overrides(_record(), ["run_dir=/r", "trainer.resume=true", "trainer.max_steps=900",
                                          "seed=0", "task=lookup", "algorithm.learning_rate=1e-2"])
    assert merged == ["+task.agent_env.X=1", "run_dir=/r", "trainer.resume=true", "trainer.max_steps=900",
                      "seed=0", "task=lookup", "algorithm.learning_rate=1e-2"]
    for override, was in (("seed=1", "0"), ("task=succ_digit", "'lookup'"), ("trainer.batch_size=8", "16"),
                          ("backend.model=/m", None)):
        with pytest.raises(ConfigError) as info:
            resume_overrides(_record(), ["trainer.resume=true", override])
        message = str(info.value)
        assert override in message and "start a new run_dir" in message
        assert (f"the run has {was}" if was else "the run did not set it") in message


def test_a_resume_may_change_the_local_trainer_s_memory_settings() -> None:
    """A run that ran out of memory resumes with smaller chunks or checkpointing: how the
    step is computed, not what is trained."""
    memory = ["backend.train_logprob_chunk=256", "backend.train_tokens_per_micro_batch=4096",
              "backend.gradient_checkpointing=true", "backend.train_bf16_autocast=true", "backend.train_micro_batch=8"]
    merged = resume_overrides(_record(), ["trainer.resume=true", *memory])
    assert merged[-len(memory):] == memory


def test_eval_and_export_reuse_the_runs_overrides_their_own_winning() -> None:
    assert reuse_overrides(_record(), ["task=succ_digit", "eval.limit=3"]) == [
        "algorithm.learning_rate=0.01", "+task.agent_env.X=1", "task=succ_digit", "eval.limit=3"
    ]


def test_run_dir_of_a_checkpoint_and_the_hydra_fallback(tmp_path: Path) -> None:
    assert run_dir_of(tmp_path / "checkpoints" / "step_000004") == tmp_path
    assert run_dir_of(tmp_path / "checkpoints" / "step_000004" / "backend") == tmp_path
    assert run_dir_of(tmp_path) == tmp_path
    assert read_run_record(tmp_path) is None
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["seed=3"]))
    record = read_run_record(tmp_path)
    assert record is not None and record.overrides == ["seed=3"]
    (tmp_path / RUN_FILE).write_text("just text\n")
    with pytest.raises(ConfigError, match="not a run record"):
        read_run_record(tmp_path)


def test_the_stored_config_redacts_secrets_but_keeps_variable_names(tmp_path: Path) -> None:
    from core.rundir.runconfig import REDACTED, write_run_record

    config = {"sampler": {"api_key": "sk-live", "urls": ["http://a"]},
              "gateway": {"admin_token": "t0ken", "max_body_bytes": 5},
              "eval": {"api_key_env": "OPENAI_API_KEY"}, "reward": {"api_key": ""}}
    write_run_record(tmp_path, overrides=["seed=1"], config=config, choices={})
    text = (tmp_path / RUN_FILE).read_text()
    assert "sk-live" not in text and "t0ken" not in text
    record = read_run_record(tmp_path)
    assert record is not None
    assert record.config["sampler"] == {"api_key": REDACTED, "urls": ["http://a"]}
    assert record.config["gateway"]["admin_token"] == REDACTED and record.config["gateway"]["max_body_bytes"] == 5
    assert record.config["eval"]["api_key_env"] == "OPENAI_API_KEY" and record.config["reward"]["api_key"] == ""
    with pytest.raises(ConfigError, match="the run did not set it"):  # a redacted value is not compared
        resume_overrides(record, ["gateway.admin_token=guess"])

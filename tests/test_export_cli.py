"""``python -m core.export`` with backends that cannot export, and bad sources (the round
trip itself is plugins/local/tests/test_export.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.export import export_checkpoint, main
from core.plugins import load_plugins
from core.testing.fakes import compose, fake_backend_plugin
from core.trainer.loop import Trainer


def test_a_backend_without_export_model_is_refused_naming_it(tmp_path: Path) -> None:
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    cfg = compose(
        ["backend=fake", f"run_dir={tmp_path / 'run'}", "trainer.max_steps=1", "trainer.batch_size=1",
         "trainer.group_size=2", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.eval_size=1",
         "runtime.num_processes=1", "task.generator_kwargs.rows=8"],
        plugins,
    )
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"backend 'fake' cannot write a model directory \(it has no export_model\)"):
        asyncio.run(export_checkpoint(cfg, plugins, str(tmp_path / "run"), str(out), adapter=False))
    assert not out.exists()


def test_a_source_that_is_no_run_or_checkpoint_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "is neither a checkpoint directory" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()

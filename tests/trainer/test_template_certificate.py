"""``python -m core.train`` certifies the model's chat template on start: it refuses one whose
traces would not be exact (naming the failing case and ``gateway.allow_uncertified_template``)
and trains with it when that override is set.

The model is the local backend's tiny one with its offline tokenizer, saved with the
whitespace-broken template of tests/gateway/test_certify.py and passed as ``backend.tokenizer``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from core.tokenizer import build_tiny_tokenizer
from tests.gateway.test_certify import whitespace_template

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path: Path, run: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRACERL_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "core.train", f"run_dir={tmp_path / run}", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=env,
    )


def test_training_refuses_an_uncertified_template_and_accepts_it_with_the_override(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer()
    tok.chat_template = whitespace_template()
    tok.save_pretrained(tmp_path / "tok")
    small = [f"backend.tokenizer={tmp_path / 'tok'}", "trainer.max_steps=1", "trainer.batch_size=2",
             "trainer.group_size=2", "trainer.progress=false", "trainer.eval_every=0", "runtime.num_processes=1"]
    refused = _train(tmp_path, "run", *small)
    assert refused.returncode != 0
    assert "the model's chat template does not certify: case 'plain'" in refused.stderr, refused.stderr
    assert "trace 42 'H', template 98 '\\n'" in refused.stderr
    assert "gateway.allow_uncertified_template=true" in refused.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert json.loads((tmp_path / "run" / "template_certificate.json").read_text())["verdict"] == "fails"
    assert len(list((tmp_path / "cache" / "certificates").glob("*.json"))) == 1  # cached by its hash

    allowed = _train(tmp_path, "run2", *small, "gateway.allow_uncertified_template=true")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "warning: training with an uncertified chat template" in allowed.stderr
    assert (tmp_path / "run2" / "metrics.jsonl").exists()

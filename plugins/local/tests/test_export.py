"""``python -m core.export``: a trained run's checkpoint as a Hugging Face model directory (#30).

A real 2-step run of the embedded task (``python -m core.train``, tiny model, with and
without LoRA) is exported from its run directory alone; the directory loaded by
``transformers.AutoModelForCausalLM.from_pretrained`` gives the logprobs the trainer
computes for the checkpoint, and its tokenizer the trainer's token ids and chat template.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from local_helpers import run
from tracerl_local.backend import LocalBackend

from core.entry import run_argv
from core.eval.cli import resolve_checkpoint
from core.export import _compose, main
from core.plugins import load_plugins
from core.types import Datum

ROOT = Path(__file__).resolve().parents[3]
CHAT = [{"role": "user", "content": "Next digit after 3?"}, {"role": "assistant", "content": "4"}]


def _train(run_dir: Path, *extra: str) -> None:
    """A 2-step run whose updates move the weights (entropy bonus, large step size)."""
    paths = [str(ROOT), str(ROOT / "plugins" / "local"), os.environ.get("PYTHONPATH", "")]
    proc = subprocess.run(
        [
            sys.executable, "-m", "core.train", f"run_dir={run_dir}", "trainer.max_steps=2",
            "trainer.batch_size=2", "trainer.group_size=2", "trainer.eval_size=2", "trainer.progress=false",
            "runtime.num_processes=1", "algorithm.learning_rate=0.05", *extra,
        ],
        capture_output=True, text=True, timeout=300, cwd=run_dir.parent,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


LORA = ("backend.lora.enabled=true", "backend.lora.rank=4", "backend.lora.alpha=8")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One full-weights run for the module's tests: they only read it (an export writes elsewhere)."""
    run_dir = tmp_path_factory.mktemp("full") / "run"
    _train(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One LoRA run, read by both LoRA export modes."""
    pytest.importorskip("peft", reason="LoRA needs the tracerl-local[lora] extra")
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    _train(run_dir, *LORA)
    return run_dir


def _trainer_logprobs(run_dir: Path, *, load: bool) -> tuple[list[float], list[int], str]:
    """Logprobs of the chat's tokens as the run's backend computes them for training."""
    plugins = load_plugins()
    cfg = _compose(run_argv([], str(run_dir)), plugins)
    backend = LocalBackend.from_config(cfg)
    try:
        if load:
            run(backend.load_state(resolve_checkpoint(str(run_dir))))
        tok = backend.get_tokenizer()
        text = tok.apply_chat_template(CHAT, tokenize=False)
        ids = list(tok.encode(text, add_special_tokens=False))
        n = len(ids) - 1
        datum = Datum(model_input=ids[:-1], target_tokens=ids[1:], logprobs=[0.0] * n, advantages=[0.0] * n, weights=[1.0] * n)
        result = run(backend.forward_backward([datum], "cross_entropy", {}))
        return [float(x) for x in result.logprobs[0]], ids, str(text)
    finally:
        run(backend.aclose())


def _hf_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [float(x) for x in lp]


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["full", "lora merged", "lora adapter"])
def test_exported_directory_gives_the_trainers_logprobs(
    tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    from transformers import AutoTokenizer

    run_dir: Path = request.getfixturevalue("full_run" if mode == "full" else "lora_run")
    out = tmp_path / "exported"
    assert main([str(run_dir), str(out), *(["--adapter"] if mode == "lora adapter" else [])]) == 0

    trained, ids, text = _trainer_logprobs(run_dir, load=True)
    initial, _, _ = _trainer_logprobs(run_dir, load=False)
    # The checkpoint's weights moved, so a directory of the initial weights would fail below.
    assert max(abs(a - b) for a, b in zip(trained, initial, strict=True)) > 1e-3
    # As a user loads it: AutoTokenizer's ids of the chat, AutoModelForCausalLM's logprobs.
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.apply_chat_template(CHAT, tokenize=False) == text
    assert list(tok.apply_chat_template(CHAT, tokenize=True, return_dict=False)) == ids
    exported = _hf_logprobs(out, list(tok.encode(text, add_special_tokens=False)))
    assert exported == pytest.approx(trained, abs=2e-5)
    record = json.loads((out / "tracerl_export.json").read_text())
    assert record["format"] == {"full": "full", "lora merged": "merged", "lora adapter": "peft_adapter"}[mode]
    if mode == "lora adapter":
        assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
        assert (out / "base" / "model.safetensors").is_file()
    else:
        assert not (out / "adapter_config.json").exists()
        eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
        assert tok.convert_tokens_to_ids("<|im_end|>") in (eos if isinstance(eos, list) else [eos])


def test_export_refuses_a_non_empty_directory_and_adapter_without_lora(
    tmp_path: Path, full_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = full_run
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert main([str(run_dir), str(busy)]) == 1
    assert "not an empty directory" in capsys.readouterr().err
    assert (busy / "keep.txt").read_text() == "mine"
    assert main([str(run_dir), str(tmp_path / "a"), "--adapter"]) == 1
    assert "backend.lora.enabled=false" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_an_adapter_names_a_local_base_model_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_backend: Any
) -> None:
    """A run on a model directory given relative to its working directory: the adapter's
    ``base_model_name_or_path`` still finds it from anywhere."""
    pytest.importorskip("peft", reason="LoRA needs the tracerl-local[lora] extra")
    from tracerl_local.config import LocalBackendConfig, LoraConfig

    source = LocalBackend(LocalBackendConfig(), seed=2)
    source.model.save_pretrained(tmp_path / "base-hf")
    source.get_tokenizer().save_pretrained(tmp_path / "base-hf")
    run(source.aclose())
    monkeypatch.chdir(tmp_path)
    backend = make_backend(model="base-hf", lora=LoraConfig(enabled=True, rank=4, alpha=8))
    out = Path(run(backend.export_model("adapter", adapter=True)))
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "base-hf").resolve())
    assert not (out / "base").exists()  # a real base is named, not copied


def test_autotokenizer_loads_the_exported_tiny_tokenizer(tmp_path: Path, make_backend: Any) -> None:
    """The tiny preset's own byte-level BPE sits in a Qwen2 architecture, and transformers 5
    loads a qwen2 directory with Qwen2Tokenizer (its own pre-tokenizer: digits one by one)
    whatever ``tokenizer_class`` says; the export's ``auto_map`` makes ``AutoTokenizer`` load
    the tokenizer that was trained, with and without ``trust_remote_code``."""
    from transformers import AutoTokenizer

    from core.tokenizer_export import fingerprint, first_difference

    backend = make_backend()
    out = Path(run(backend.export_model(str(tmp_path / "model"))))
    trained = fingerprint(backend.get_tokenizer())
    assert trained["encode"][5]["plain"] != []  # "digits 12345 ...": where Qwen2's splitting differs
    for trust in (False, True):
        loaded = AutoTokenizer.from_pretrained(str(out), trust_remote_code=trust)
        assert first_difference(trained, fingerprint(loaded)) is None, (trust, type(loaded).__name__)
    # Without the export's auto_map, AutoTokenizer gives other ids: what the entry prevents.
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    del config["auto_map"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    assert first_difference(trained, fingerprint(AutoTokenizer.from_pretrained(str(out)))) == "encode"


def test_an_export_autotokenizer_cannot_load_still_stands_with_a_warning(
    tmp_path: Path, make_backend: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The AutoTokenizer check after saving never loses the export (a tokenizer of remote
    code, for one, needs ``trust_remote_code``): it warns how to load the tokenizer instead."""
    import transformers

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("needs trust_remote_code=True")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    backend = make_backend()
    with caplog.at_level("WARNING", logger="tracerl_local.export"):
        out = Path(run(backend.export_model(str(tmp_path / "model"))))
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    (warning,) = [r.getMessage() for r in caplog.records if "AutoTokenizer.from_pretrained" in r.getMessage()]
    assert "AutoTokenizer cannot load it: ValueError: needs trust_remote_code=True" in warning

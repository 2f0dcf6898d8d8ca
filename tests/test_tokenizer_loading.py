"""``load_tokenizer_without_torch``: the tokenizer ``AutoTokenizer`` gives, in a process that never imports torch.

The tokenizer directories are written here from the offline tokenizers (the
tiny ChatML one and the Llama-3-style one), with ``tokenizer_config.json``
naming a class as model repositories do. Whether torch is imported is checked
in a fresh interpreter, so imports earlier in the test session cannot hide it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from core.testing.tokenizers import EOM, build_llama3_style_tokenizer
from core.tokenizer import build_tiny_tokenizer, end_of_turn_ids, load_tokenizer
from core.tokenizer_export import fingerprint, load_tokenizer_without_torch
from tests.gateway_process import served_gateway
from tests.proc_memory import peak_mb

CHAT = [
    {"role": "system", "content": "Say the next digit."},
    {"role": "user", "content": "After 3?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "After 9?"},
]


def _save(tok: Any, path: Path, tokenizer_class: str | None) -> Path:
    tok.save_pretrained(str(path))
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if tokenizer_class is None:
        config.pop("tokenizer_class", None)
    else:
        config["tokenizer_class"] = tokenizer_class
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("toks")
    llama = _save(build_llama3_style_tokenizer(), root / "llama3", "PreTrainedTokenizerFast")
    # Llama 3 lists its end-of-turn ids in generation_config.json, beside the tokenizer.
    eot = build_llama3_style_tokenizer().convert_tokens_to_ids(EOM)
    (llama / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot]}), encoding="utf-8")
    return {
        # A Qwen2-style repository names Qwen2Tokenizer; AutoTokenizer picks its class.
        "qwen2": _save(build_tiny_tokenizer(), root / "qwen2", "Qwen2Tokenizer"),
        "llama3": llama,
    }


_LOAD_IN_FRESH_PROCESS = """
import json, sys
from core.tokenizer_export import load_tokenizer_without_torch
out = {}
for path in sys.argv[2:]:
    tok = load_tokenizer_without_torch(path)
    ids = tok.apply_chat_template(json.loads(sys.argv[1]), tokenize=True, add_generation_prompt=True)
    out[path] = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
print(json.dumps({"torch": "torch" in sys.modules, "ids": out}))
"""


def test_loads_without_torch_and_renders_as_auto_tokenizer_does(dirs: dict[str, Path]) -> None:
    """One fresh interpreter loads two directories: no torch, and AutoTokenizer's ids."""
    paths = [str(dirs[name]) for name in ("qwen2", "llama3")]
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_FRESH_PROCESS, json.dumps(CHAT), *paths],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fresh["torch"] is False, "loading a tokenizer directory imported torch in the caller"
    for path in paths:
        expected = load_tokenizer(path).apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert fresh["ids"][path] == list(expected), path


def test_the_copy_matches_every_probe_and_keeps_the_end_of_turn_ids(dirs: dict[str, Path]) -> None:
    auto = load_tokenizer(str(dirs["llama3"]))
    copy = load_tokenizer_without_torch(str(dirs["llama3"]))
    assert json.loads(json.dumps(fingerprint(copy))) == json.loads(json.dumps(fingerprint(auto)))
    assert copy.name_or_path == str(dirs["llama3"])
    # EOS, the generation_config.json list and the template's <|eot_id|>, as from the original.
    assert end_of_turn_ids(copy) == end_of_turn_ids(auto)
    assert len(end_of_turn_ids(copy)) == 3


def _child_answers(monkeypatch: pytest.MonkeyPatch, returncode: int, stdout: str, stderr: str = "") -> None:
    """The child process's answer, without starting it: what is tested is the caller's decision."""
    import core.tokenizer_export as export

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, returncode, stdout, stderr)

    monkeypatch.setattr(export.subprocess, "run", run)


def test_a_copy_that_differs_falls_back_to_auto_tokenizer(
    dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The child says its copy differs from the original: the caller loads with AutoTokenizer, and says why."""
    verdict = {"ok": False, "difference": "chat/tools/True", "fingerprint": {}, "class": "Qwen2TokenizerFast"}
    _child_answers(monkeypatch, 0, json.dumps(verdict) + "\n")
    with caplog.at_level(logging.WARNING, logger="core.tokenizer_export"):
        tok = load_tokenizer_without_torch(str(dirs["qwen2"]))
    assert "differs in 'chat/tools/True'" in caplog.text
    assert type(tok).__name__ == type(load_tokenizer(str(dirs["qwen2"]))).__name__


def test_a_copy_loaded_here_that_differs_falls_back(
    dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The child's copy agreed, but what the caller loads from it does not match the child's fingerprint."""
    import core.tokenizer_export as export

    def fake_child(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        verdict = export.export(args[-2], args[-1])  # the child's work, in this process
        verdict["fingerprint"]["size"] += 1  # as if the copy had lost a token on the way
        return subprocess.CompletedProcess(args, 0, json.dumps(verdict) + "\n", "")

    monkeypatch.setattr(export.subprocess, "run", fake_child)
    with caplog.at_level(logging.WARNING, logger="core.tokenizer_export"):
        load_tokenizer_without_torch(str(dirs["qwen2"]))
    assert "the copy loaded here differs in 'size'" in caplog.text


def test_a_failing_child_leaves_the_error_to_the_loader_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A path that does not exist fails in the child; the caller's own load raises the real error."""
    _child_answers(monkeypatch, 1, "", "OSError: no such tokenizer\n")
    with caplog.at_level(logging.WARNING, logger="core.tokenizer_export"), pytest.raises(OSError):
        load_tokenizer_without_torch(str(tmp_path / "nowhere"))
    assert "OSError: no such tokenizer" in caplog.text


def test_a_child_that_times_out_or_prints_no_verdict_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A child past its timeout, or one whose last line is not the JSON verdict, is a logged
    fallback to the loader itself (which raises the real error here), not a crash of the caller."""
    import core.tokenizer_export as export

    def slow(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    monkeypatch.setattr(export.subprocess, "run", slow)
    with caplog.at_level(logging.WARNING, logger="core.tokenizer_export"), pytest.raises(OSError):
        load_tokenizer_without_torch(str(tmp_path / "nowhere"), timeout_s=5)
    assert "took over 5s" in caplog.text
    _child_answers(monkeypatch, 0, '{"ok": true}\nsome library chatter\n')
    with caplog.at_level(logging.WARNING, logger="core.tokenizer_export"), pytest.raises(OSError):
        load_tokenizer_without_torch(str(tmp_path / "nowhere"))
    assert "no verdict in its output (2 lines)" in caplog.text


@pytest.mark.integration
def test_the_gateway_cli_with_a_tokenizer_directory_never_imports_torch(dirs: dict[str, Path]) -> None:
    """``python -m core.gateway --tokenizer DIR`` serves a turn, and its process never imports torch."""
    code = (
        "import runpy, sys, threading, os, json, time\n"
        "def watch():\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "        if 'torch' in sys.modules:\n"
        "            print(json.dumps({'torch': True}), flush=True); os._exit(3)\n"
        "threading.Thread(target=watch, daemon=True).start()\n"
        "sys.argv = ['core.gateway', '--tokenizer', sys.argv[1], '--reply', 'pong']\n"
        "runpy.run_module('core.gateway', run_name='__main__')\n"
    )
    import openai

    proc = subprocess.Popen([sys.executable, "-c", code, str(dirs["qwen2"])], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert "torch" not in info, "the gateway process imported torch"
        with openai.OpenAI(base_url=info["base_url"], api_key=info["sessions"][0], max_retries=0) as client:
            out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "After 3?"}])
        assert out.choices[0].message.content == "pong"
        time.sleep(0.3)  # the watcher looks every 50 ms
        assert proc.poll() is None, "the gateway process exited (it imported torch)"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _tiny_tekken(path: Path) -> Path:
    """A small Tekken (v3) tokenizer file in Mistral's format: the 256 bytes, a few merges,
    mistral-common's default special tokens (``[INST]``, ``[TOOL_CALLS]``, ... at ids 0-19)."""
    import base64

    merged = [b"ca", b"lc", b"calc", b"ul", b"calcul", b"at", b"or", b"ator", b"calculator"]
    vocab = [bytes([b]) for b in range(256)] + merged
    pattern = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    data = {
        "config": {"pattern": pattern, "num_vocab_tokens": len(vocab), "default_vocab_size": len(vocab) + 20,
                   "default_num_special_tokens": 20, "version": "v3"},
        "vocab": [{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": None} for i, t in enumerate(vocab)],
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "tekken.json").write_text(json.dumps(data), encoding="utf-8")
    return path / "tekken.json"


def test_a_mistral_tokenizer_in_mistrals_format_gets_a_chat_template_that_encodes_as_mistral_common(
    tmp_path: Path,
) -> None:
    """transformers 5 with mistral-common loads a checkpoint's tekken.json as ``MistralCommonBackend``,
    which has no Jinja template; ``with_chat_template`` converts it, and the template it gets
    renders a tool conversation to mistral-common's own ids."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from transformers.tokenization_mistral_common import MistralCommonBackend

    from core.gateway.render import ChatRenderer
    from core.tokenizer import with_chat_template

    tekken = _tiny_tekken(tmp_path / "model")
    # Its generation_config.json lists a second end of turn (id 7): the conversion keeps the
    # directory (name_or_path), so the stop ids still include it.
    (tmp_path / "model" / "generation_config.json").write_text('{"eos_token_id": [2, 7]}', encoding="utf-8")
    native = MistralCommonBackend.from_pretrained(str(tmp_path / "model"))
    assert not getattr(native, "chat_template", None)
    with pytest.raises(Exception, match="chat_template"):
        ChatRenderer(native)
    tok = with_chat_template(native)
    assert "[TOOL_CALLS]" in tok.chat_template and with_chat_template(tok) is tok
    tools = [{"type": "function", "function": {"name": "calculator", "description": "calc",
                                               "parameters": {"type": "object", "properties": {}}}}]
    call = {"id": "aB3dE6gH9", "type": "function", "function": {"name": "calculator", "arguments": "{\"x\": 1}"}}
    chat = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "calculate 1"},
            {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "aB3dE6gH9", "content": "1"},
            {"role": "assistant", "content": "one"}]
    reference = MistralTokenizer.from_file(str(tekken), mode=ValidationMode.agnostic).encode_chat_completion(
        ChatCompletionRequest(messages=chat, tools=tools)  # type: ignore[arg-type]
    )
    renderer = ChatRenderer(tok)
    rendered = renderer.render_text([dict(m) for m in chat], tools, add_generation_prompt=False)
    assert renderer.encode(rendered) == reference.tokens
    assert rendered.endswith('[TOOL_RESULTS]{"content": 1, "call_id": "aB3dE6gH9"}[/TOOL_RESULTS]one</s>')
    assert tok.name_or_path == str(tekken.parent)
    assert end_of_turn_ids(tok) == (tok.convert_tokens_to_ids("</s>"), 7)


def test_load_tokenizer_gives_a_mistral_checkpoint_a_chat_template(tmp_path: Path) -> None:
    """A checkpoint directory as Mistral publishes it (``config.json`` of a ``mistral`` model and
    its ``tekken.json``): ``AutoTokenizer`` gives ``MistralCommonBackend``, ``load_tokenizer`` a
    fast tokenizer with a template."""
    _tiny_tekken(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}), encoding="utf-8")
    from transformers import AutoTokenizer

    assert type(AutoTokenizer.from_pretrained(str(tmp_path))).__name__ == "MistralCommonBackend"
    tok = load_tokenizer(str(tmp_path))
    assert "[TOOL_CALLS]" in tok.chat_template
    assert tok.decode(tok.encode("calculator", add_special_tokens=False)) == "calculator"


def test_a_bpe_copy_travels_in_pieces_and_rebuilds_the_original_backend(
    dirs: dict[str, Path], tmp_path: Path,
) -> None:
    """``export`` saves a BPE tokenizer as its vocabulary, merges and pipeline (no
    ``tokenizer.json``, which costs a loader several times the tokenizer's memory to parse), and
    the backend rebuilt from them serializes exactly as the one ``AutoTokenizer`` loaded."""
    import core.tokenizer_export as export

    dest = tmp_path / "copy"
    verdict = export.export(str(dirs["llama3"]), str(dest))
    assert verdict["ok"] and verdict["digest"]
    assert (dest / export.SPLIT_FILE).is_file() and not (dest / "tokenizer.json").exists()
    assert "added_tokens_decoder" in json.loads((dest / "tokenizer_config.json").read_text(encoding="utf-8"))
    copy = export._load_copy(str(dest), digest=verdict["digest"])
    assert copy.backend_tokenizer.to_str() == load_tokenizer(str(dirs["llama3"])).backend_tokenizer.to_str()
    with pytest.raises(export.CopyDiffers):
        export._load_copy(str(dest), digest="0" * 64)


def test_a_copy_whose_backend_rebuilds_differently_here_falls_back(
    dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The child's pieces rebuild to another digest in the caller: it loads with AutoTokenizer, and says why."""
    import core.tokenizer_export as export

    def fake_child(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        verdict = export.export(args[-2], args[-1])
        verdict["digest"] = "0" * 64
        return subprocess.CompletedProcess(args, 0, json.dumps(verdict) + "\n", "")

    monkeypatch.setattr(export.subprocess, "run", fake_child)
    with caplog.at_level(logging.WARNING, logger="core.tokenizer_export"):
        tok = load_tokenizer_without_torch(str(dirs["qwen2"]))
    assert "does not serialize as the original's" in caplog.text
    assert tok.backend_tokenizer.to_str() == load_tokenizer(str(dirs["qwen2"])).backend_tokenizer.to_str()


def test_a_tokenizer_that_is_not_bpe_keeps_its_tokenizer_json(tmp_path: Path) -> None:
    """Only a BPE model has a file reader (``BPE.from_file``); a word-level one travels whole."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import core.tokenizer_export as export

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")  # type: ignore[no-untyped-call]
    tok.save_pretrained(str(tmp_path))
    assert export._write_split(tok, str(tmp_path)) is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("tracerl", "tokenizer."))) == ["tokenizer.json"]
    assert export._load_copy(str(tmp_path)).encode("a b c", add_special_tokens=False) == [0, 1, 2]


_PEAK_MB = 145
"""Bound on the served gateway's ``VmHWM`` with Qwen3's tokenizer (see the test below)."""


@pytest.mark.integration
@pytest.mark.slow
def test_the_gateway_with_qwen3s_tokenizer_peaks_under_its_memory_bound() -> None:
    """``python -m core.gateway --tokenizer QWEN3_DIR`` serves a turn with its peak resident
    memory (``VmHWM``, from start) under ``_PEAK_MB``.

    Why this bound: docs/performance.md's target is a gateway process under 150 MB at its peak
    with 256 sessions of ~1k tokens held, which the benchmark measures; those sessions add about
    11 MB to the ~131 MB this start and turn reached (2026-12-02). Before the tokenizer copy
    travelled in pieces, the load alone peaked at 277-285 MB (``tokenizer.json`` parsed by Python's
    ``json`` and by ``tokenizers``' generic deserializer at once), and reading the vocabulary with
    ``get_vocab()`` added 26 MB more after it; either regression passes the bound. Resident memory
    does not depend on the machine's load the way timings do, so the margin (about 14 MB) covers
    allocator noise, not contention.
    """
    import openai

    from tests.gateway.families import FAMILIES, files

    with served_gateway("--tokenizer", str(files(FAMILIES["qwen3"])), "--reply", "pong") as (proc, info):
        with openai.OpenAI(base_url=info["base_url"], api_key=info["sessions"][0], max_retries=0) as client:
            out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
        assert out.choices[0].message.content == "pong"
        peak = peak_mb(proc.pid)
        assert peak < _PEAK_MB, f"the gateway peaked at {peak:.0f} MB resident (bound {_PEAK_MB} MB)"

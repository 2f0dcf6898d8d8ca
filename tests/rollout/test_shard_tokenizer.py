"""How a gateway shard loads the trainer's tokenizer: the split copy ``shard_spec`` ships, as the
gateway CLI loads its own (``core.tokenizer_export.load_checked_copy``), or the whole save with
``from_pretrained`` after a warning naming what differed.

Each test starts a real ``python -m core.gateway shard SPEC`` process and talks to it over HTTP
with the official openai SDK; its startup line names the directory its tokenizer came from.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from core.gateway import Gateway, GatewayConfig
from core.rollout.shards import ShardSpec, shard_spec
from core.samplers import ScriptedSampler
from tests.proc_memory import peak_mb

ROOT = Path(__file__).resolve().parents[2]
REPLY = "Looked up: 42 (naïve café 🙂)."
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}}]
CHAT = [
    {"role": "system", "content": "You are terse. 日本語も話せます。"},
    {"role": "user", "content": "Look up a, then tell me: what is 12 * 7?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
]

PEAK_MB = 150
"""Bound on a shard's ``VmHWM`` with Qwen3's tokenizer after a turn (see the test below)."""


def _spec(tok: Any, folder: Path) -> ShardSpec:
    gw = Gateway(tokenizer=tok, sampler=ScriptedSampler(tokenizer=tok), config=GatewayConfig(), model_id="m")
    return shard_spec(gw, {"kind": "scripted", "reply": REPLY}, folder)


@dataclasses.dataclass
class _Served:
    info: dict[str, Any]
    """The shard's startup line (``root_url``, ``base_url``, ``pid``, ``tokenizer``)."""
    proc: subprocess.Popen[str]
    stderr: str = ""
    """What it wrote to stderr, once stopped."""


@contextmanager
def _shard(spec: ShardSpec, path: Path) -> Iterator[_Served]:
    """``python -m core.gateway shard`` serving ``spec`` (written at ``path``), stopped by closing its stdin."""
    path.write_text(json.dumps(dataclasses.asdict(spec)), encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.gateway", "shard", str(path), "--port", "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"the shard exited with {proc.returncode} before listening:\n{err}")
    served = _Served(json.loads(line), proc)
    try:
        yield served
    finally:
        try:
            _, served.stderr = proc.communicate(timeout=30)  # closes stdin: the shard stops
        except subprocess.TimeoutExpired:
            proc.kill()
            _, served.stderr = proc.communicate()


def _turn(served: _Served, spec: ShardSpec, tools: bool = True) -> dict[str, Any]:
    """One chat turn (the tool conversation) in a new session; the session's trace row."""
    admin = {"authorization": f"Bearer {spec.gateway['admin_token']}"}
    root = served.info["root_url"]
    sid = httpx.post(root + "/admin/sessions", headers=admin, json={"sampling": {"max_tokens": 64}}).json()["session_id"]
    with openai.OpenAI(base_url=served.info["base_url"], api_key=sid, max_retries=0) as client:
        out = client.chat.completions.create(
            model="m", messages=CHAT, tools=TOOLS if tools else openai.NOT_GIVEN,  # type: ignore[arg-type]
        )
    assert out.choices[0].message.content == REPLY
    rows = httpx.get(f"{root}/admin/sessions/{sid}/trace", headers=admin).json()["rows"]
    assert len(rows) == 1
    return dict(rows[0])


def _same_tokens(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("token_ids", "prompt_length", "loss_mask", "logprobs"):
        assert a[key] == b[key], key


@pytest.mark.integration
@pytest.mark.slow
def test_a_shard_with_qwen3s_tokenizer_loads_the_split_copy_renders_as_from_pretrained_and_peaks_under_its_bound(
    tmp_path: Path,
) -> None:
    """Two shards from one spec, one loading the split copy (the default) and one the whole
    save with ``from_pretrained`` (``tokenizer_split_dir`` emptied): the same tool conversation
    gives the same tokens, and the split one's peak resident memory stays under ``PEAK_MB``.

    Why this bound: the shard read 136 MB after start-up and a turn (2026-12-02); the
    ``from_pretrained`` shard, 275 (``tokenizer.json`` parsed by Python's ``json`` and by
    ``tokenizers``' generic deserializer at once), which this test reports beside it. Resident
    memory does not depend on the machine's load, so the margin (about 14 MB) covers allocator
    noise, not contention.
    """
    from core.tokenizer import load_tokenizer
    from tests.gateway.families import FAMILIES, files

    spec = _spec(load_tokenizer(str(files(FAMILIES["qwen3"]))), tmp_path)
    split = Path(spec.tokenizer_split_dir)
    assert spec.tokenizer_digest and not (split / "tokenizer.json").exists()
    whole = dataclasses.replace(spec, tokenizer_split_dir="", tokenizer_digest="")
    with _shard(spec, tmp_path / "split.json") as served, _shard(whole, tmp_path / "whole.json") as reference:
        assert served.info["tokenizer"] == str(split)
        assert reference.info["tokenizer"] == spec.tokenizer_dir
        for tools in (True, False):
            _same_tokens(_turn(served, spec, tools), _turn(reference, whole, tools))
        peak, peak_whole = peak_mb(served.info["pid"]), peak_mb(reference.info["pid"])
    # docs/performance.md ("Gateway peak memory") quotes this line: `python -m pytest -s ... -k qwen3`
    print(f"\ngateway shard peak (VmHWM) with Qwen3's tokenizer after a turn: split copy {peak:.1f} MB, "
          f"from_pretrained {peak_whole:.1f} MB")
    assert "loading it with" not in served.stderr, served.stderr
    assert peak < PEAK_MB, (
        f"the shard peaked at {peak:.0f} MB resident (bound {PEAK_MB} MB; from_pretrained's: {peak_whole:.0f} MB)"
    )


@pytest.mark.integration
def test_a_split_copy_with_the_wrong_digest_falls_back_to_from_pretrained_with_a_warning(
    byte_tokenizer: Any, tmp_path: Path,
) -> None:
    """The split copy rebuilds to another sha256 than the spec's: the shard loads the whole save,
    says so on stderr naming both digests, and serves the same tokens."""
    spec = _spec(byte_tokenizer, tmp_path)
    assert spec.tokenizer_split_dir and spec.tokenizer_digest
    wrong = dataclasses.replace(spec, tokenizer_digest="0" * 64)
    with _shard(wrong, tmp_path / "wrong.json") as fell_back, _shard(spec, tmp_path / "split.json") as served:
        assert fell_back.info["tokenizer"] == spec.tokenizer_dir
        assert served.info["tokenizer"] == spec.tokenizer_split_dir
        _same_tokens(_turn(fell_back, wrong), _turn(served, spec))
    assert "does not serialize as the original's" in fell_back.stderr, fell_back.stderr
    assert f"the original's {'0' * 12}..." in fell_back.stderr and spec.tokenizer_digest[:12] in fell_back.stderr
    assert f"loading it with from_pretrained({spec.tokenizer_dir!r})" in fell_back.stderr
    assert "loading it with" not in served.stderr, served.stderr


@pytest.mark.integration
def test_a_split_copy_that_renders_differently_falls_back_naming_the_probe(
    byte_tokenizer: Any, tmp_path: Path,
) -> None:
    """The split copy's backend is the original's (same digest), but its saved config carries
    another chat template: the fingerprint names the probe, and the shard loads the whole save."""
    spec = _spec(byte_tokenizer, tmp_path)
    config_path = Path(spec.tokenizer_split_dir) / "tokenizer_config.json"
    template = Path(spec.tokenizer_split_dir) / "chat_template.jinja"
    if template.exists():  # transformers 5 saves the template beside the config
        template.write_text(template.read_text(encoding="utf-8") + "tampered", encoding="utf-8")
    else:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["chat_template"] += "tampered"
        config_path.write_text(json.dumps(config), encoding="utf-8")
    with _shard(spec, tmp_path / "spec.json") as served:
        assert served.info["tokenizer"] == spec.tokenizer_dir
        _turn(served, spec)
    assert "the copy loaded here differs in 'chat" in served.stderr, served.stderr
    assert f"loading it with from_pretrained({spec.tokenizer_dir!r})" in served.stderr

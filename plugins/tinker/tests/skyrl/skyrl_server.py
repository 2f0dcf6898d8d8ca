"""A real SkyRL tx Tinker-API server on 127.0.0.1, for the ``skyrl`` test tier.

SkyRL tx (PyPI ``skyrl``, pinned in ``plugins/tinker/scripts/setup_skyrl_venv.sh``)
implements the Tinker REST API on JAX. It lives in its own virtual environment
(Python 3.12, its own transformers/JAX pins); the tests run in tracerl's and
reach the server only over HTTP, as a user's run would.

Nothing is downloaded: ``build_checkpoint`` writes a from-scratch Qwen3
checkpoint (random weights, tracerl's offline tiny tokenizer) to a directory,
and the server loads it by path (SkyRL tx takes a local directory as
``--base-model``).

Two quirks of how SkyRL tx starts are handled here, not in the plugin (a user
starts the server with ``uv``, as SkyRL documents):

- The API process starts its engine as ``uv run <the API's own uv flags>
  --extra tinker --extra jax -m skyrl.tinker.engine ...``, reading those flags
  from its parent's command line. A ``uv`` stand-in on ``PATH`` (``UV_SHIM``)
  runs ``-m ...`` with the venv's Python instead, and is also the API's parent.
- The engine loads the model after the API answers ``/healthz``; requests
  queue in its database meanwhile, so the first call just waits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
SKYRL_VERSION = "0.4.0"
"""The pinned server release (setup_skyrl_venv.sh installs it)."""

UV_SHIM = """#!/usr/bin/env bash
# Stands in for `uv run [uv flags] -m module args...`: runs the module with SkyRL's venv Python.
# Not `exec`: the API server reads its parent's command line to build its engine's command.
while [[ $# -gt 0 && "$1" != "-m" ]]; do shift; done
"$TRACERL_SKYRL_PYTHON" "$@"
"""


def server_python() -> Path:
    """The Python of SkyRL's venv (``TRACERL_SKYRL_PYTHON``, else ``<repo>/.venv-skyrl``)."""
    return Path(os.environ.get("TRACERL_SKYRL_PYTHON") or ROOT / ".venv-skyrl" / "bin" / "python")


def server_version(python: Path) -> str:
    """The installed ``skyrl`` distribution's version, read inside its venv."""
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('skyrl'))"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return out.stdout.strip()


@dataclass(frozen=True)
class Checkpoint:
    """A tiny model directory the server loads, and what it holds."""

    path: Path
    parameters: int
    vocab_size: int
    config: dict[str, Any]


def build_checkpoint(directory: Path, *, seed: int = 0) -> Checkpoint:
    """A Qwen3-architecture causal LM with random weights and the offline tiny tokenizer.

    Small enough that a JAX step on 2 CPU cores takes seconds; Qwen3 because it
    is one of the architectures SkyRL tx implements (``skyrl.tx.models.qwen3``).
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from core.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Checkpoint(
        path=directory,
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=len(tokenizer),
        config=json.loads((directory / "config.json").read_text()),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SkyrlServer:
    """``skyrl.tinker.api`` (and the engine it starts) as a process group on 127.0.0.1."""

    def __init__(self, python: Path, model_dir: Path, workdir: Path, *, max_lora_rank: int = 8) -> None:
        self.python = python
        self.model_dir = model_dir
        self.workdir = workdir
        self.max_lora_rank = max_lora_rank
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> SkyrlServer:
        """Start the server and wait until it answers ``/api/v1/healthz``."""
        bin_dir = self.workdir / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        shim = bin_dir / "uv"
        shim.write_text(UV_SHIM)
        shim.chmod(0o755)
        env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "TRACERL_SKYRL_PYTHON": str(self.python),
            "JAX_PLATFORMS": "cpu",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        env.pop("PYTHONPATH", None)  # tracerl's paths mean nothing to SkyRL's interpreter
        backend_config = {
            "max_lora_adapters": 32,
            "max_lora_rank": self.max_lora_rank,
        }
        cmd = [
            str(shim), "run", "-m", "skyrl.tinker.api",
            "--base-model", str(self.model_dir),
            "--backend", "jax",  # 0.4.0's default is megatron (GPU, Ray)
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--database-url", f"sqlite:///{self.workdir / 'tinker.db'}",
            "--checkpoints-base", str(self.workdir / "checkpoints"),
            "--backend-config", json.dumps(backend_config),
        ]
        with self.log_path.open("wb") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                cmd, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"SkyRL tx server exited ({self._proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/api/v1/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass  # not listening yet: poll again until the deadline
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SkyRL tx server did not answer within {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the API server and its engine (the whole process group)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass  # the server's process group has already exited

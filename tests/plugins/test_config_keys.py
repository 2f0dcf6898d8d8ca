"""Plugin config nodes refuse unknown keys, with or without Hydra's ``+`` prefix."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from core.errors import ConfigError
from core.plugins import BackendSpec, hookimpl, load_plugins
from core.testing.fakes import compose


@dataclass
class _Inner:
    depth: int = 1


@dataclass
class _KeysConfig:
    name: str = "keys"
    log_every: int = 1
    inner: _Inner = field(default_factory=_Inner)
    env: dict[str, str] = field(default_factory=dict)


def _plugins():  # type: ignore[no-untyped-def]
    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        registry.add(BackendSpec(name="keys", kind="driving", factory=lambda c: None, config=_KeysConfig))

    module = ModuleType("keys_plugin")
    module.tracerl_register_backends = tracerl_register_backends  # type: ignore[attr-defined]
    return load_plugins(extra_plugins=(module,))


@pytest.mark.parametrize("prefix", ["+", "++"])
def test_plus_prefixed_typo_is_refused_with_the_valid_keys(prefix: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose(["backend=keys", "run_dir=x", f"{prefix}backend.log_evry=3"], _plugins())
    message = str(info.value)
    assert "unknown key backend.log_evry" in message
    assert "Did you mean backend.log_every?" in message
    assert "Valid keys of backend: env, inner, log_every, name." in message
    assert "plugin 'keys_plugin'" in message


def test_typo_without_plus_is_refused_too() -> None:
    with pytest.raises(Exception, match="log_evry"):
        compose(["backend=keys", "run_dir=x", "backend.log_evry=3"], _plugins())


def test_nested_dataclass_keys_are_checked_free_form_dicts_are_not() -> None:
    plugins = _plugins()
    with pytest.raises(ConfigError, match=r"backend\.inner\.dpth.*Valid keys of backend\.inner: depth\."):
        compose(["backend=keys", "run_dir=x", "+backend.inner.dpth=2"], plugins)
    cfg = compose(["backend=keys", "run_dir=x", "+backend.env.MY_VAR=x", "backend.log_every=4"], plugins)
    assert cfg.backend.env.MY_VAR == "x" and cfg.backend.log_every == 4


def test_runtime_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"runtime\.num_procs.*Did you mean runtime\.num_processes\?"):
        compose(["run_dir=x", "+runtime.num_procs=2"], load_plugins())


def test_cli_refuses_a_plus_prefixed_typo_before_training(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "core.train", "+backend.log_evry=3", f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120,
    )
    assert proc.returncode != 0
    assert "error: unknown key backend.log_evry" in proc.stderr
    assert "Valid keys of backend:" in proc.stderr and "max_batch_size" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

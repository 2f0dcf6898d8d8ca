"""``backend=local`` is found through the entry point and composes with Hydra overrides."""

from __future__ import annotations

from pathlib import Path

from local_helpers import run
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig

from core.plugins import load_plugins
from core.testing.fakes import compose


def test_entry_point_registers_local_backend(tmp_path: Path) -> None:
    plugins = load_plugins()
    spec = plugins.backend("local")
    assert spec.config is LocalBackendConfig and spec.kind == "driven"
    assert plugins.backends.origin("local").distribution == "tracerl-local"
    cfg = compose(
        [
            "backend=local",
            f"run_dir={tmp_path}",
            "seed=7",
            "backend.tiny.num_layers=1",
            "backend.batch_wait_ms=0.5",
        ],
        plugins,
    )
    backend = spec.factory(cfg)
    try:
        assert isinstance(backend, LocalBackend)
        assert backend.seed == 7 and backend.config.batch_wait_ms == 0.5
        assert backend.model.config.num_hidden_layers == 1
    finally:
        run(backend.aclose())

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


def test_a_wrapping_plugin_builds_local_backend_from_its_own_node() -> None:
    """A plugin owning a node with extra fields (here: the local settings nested under
    ``backend.local``) builds LocalBackend from it without rebuilding the run config."""
    from dataclasses import dataclass, field
    from types import ModuleType

    from core.plugins import BackendSpec, hookimpl
    from core.testing import build_backend

    @dataclass
    class WrappedConfig:
        name: str = "wrapped"
        greeting: str = "hi"
        local: LocalBackendConfig = field(default_factory=LocalBackendConfig)

    seen: dict[str, str] = {}

    def factory(cfg):  # type: ignore[no-untyped-def]
        seen["greeting"] = str(cfg.backend.greeting)
        return LocalBackend.from_config(cfg, node=cfg.backend.local)

    @hookimpl
    def tracerl_register_backends(registry):  # type: ignore[no-untyped-def]
        registry.add(BackendSpec(name="wrapped", kind="driven", factory=factory, config=WrappedConfig))

    module = ModuleType("wrapping_plugin")
    module.tracerl_register_backends = tracerl_register_backends  # type: ignore[attr-defined]
    backend = build_backend(
        "wrapped",
        ["backend.greeting=yo", "backend.local.tiny.num_layers=1", "seed=3"],
        load_plugins(extra_plugins=(module,)),
    )
    try:
        assert isinstance(backend, LocalBackend) and seen == {"greeting": "yo"}
        assert backend.model.config.num_hidden_layers == 1 and backend.seed == 3
        assert type(backend.config) is LocalBackendConfig
    finally:
        run(backend.aclose())


def test_extra_fields_of_a_wrapper_node_are_ignored_not_refused() -> None:
    from omegaconf import OmegaConf
    from tracerl_local.backend import _to_backend_config

    node = OmegaConf.create({"name": "mine", "extra": 1, "batch_wait_ms": 0.5, "tiny": {"num_layers": 1}})
    config = _to_backend_config(node)
    assert type(config) is LocalBackendConfig and config.name == "local"
    assert config.batch_wait_ms == 0.5 and config.tiny.num_layers == 1

"""Build a registered backend or runtime inside a test, as ``python -m core.train`` would.

The factory gets the same composed config a run gives it (``seed``,
``task.*``, ``backend.*``, ``runtime.*``, ...), so a test exercises the
plugin's real ``config`` node and factory, not a hand-made stand-in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.plugins.manager import Plugins, load_plugins

__all__ = ["build_backend", "build_runtime", "compose_config"]


def compose_config(overrides: Sequence[str] = (), plugins: Plugins | None = None) -> Any:
    """The composed run config (an OmegaConf ``DictConfig``) for Hydra ``overrides``.

    ``run_dir`` defaults to ``unused`` (nothing is written by composing). Unknown
    backend/runtime keys are refused as on the command line.
    """
    from core.testing.fakes import compose

    args = list(overrides)
    if not any(a.lstrip("+").startswith("run_dir=") for a in args):
        args.append("run_dir=unused")
    return compose(args, plugins or load_plugins())


def build_backend(name: str, overrides: Sequence[str] = (), plugins: Plugins | None = None) -> Any:
    """``backend=<name>`` built by its plugin's factory from the composed config.

    Raises whatever the lookup raises (``PluginError`` naming a broken plugin,
    ``BackendNotFoundError``) and whatever the factory raises.
    """
    plugins = plugins or load_plugins()
    spec = plugins.backend(name)
    return spec.factory(compose_config([f"backend={name}", *overrides], plugins))


def build_runtime(name: str, overrides: Sequence[str] = (), plugins: Plugins | None = None) -> Any:
    """``runtime=<name>`` built (not started) by its plugin's factory from the composed config.

    Pass the agent as an override, e.g. ``["task.agent=my_agent:app"]``.
    """
    plugins = plugins or load_plugins()
    spec = plugins.runtime(name)
    return spec.factory(compose_config([f"runtime={name}", *overrides], plugins))

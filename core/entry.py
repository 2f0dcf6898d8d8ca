"""What ``python -m core.train`` and ``python -m core.eval`` share before and around Hydra.

- ``load_checked_plugins``: load the plugins, register their config nodes, and look
  up the backend, runtime and reward the command line picks, so an unknown name
  fails with the installed ones listed instead of Hydra's generic error.
- ``run_hydra``: compose a primary config from an argument list and run a body on
  it, a ``TracerlError`` printed as ``error: ...`` (exit code 1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any

from core.errors import ConfigError, PluginError, TracerlError

HELP_FLAGS = ("--help", "-h", "--hydra-help", "--info")
"""Hydra's own flags that print and exit: nothing is looked up for them."""


def load_checked_plugins(argv: list[str], *, skip: Collection[str] = ()) -> Any:
    """The loaded plugins, or None after printing why the command line cannot run.

    Args:
        argv: The command line's overrides.
        skip: Groups (``backend``, ``runtime``, ``reward``) not to look up, e.g. the
            backend of an evaluation against an endpoint.
    """
    from core.config import register_configs
    from core.plugins import load_plugins
    from core.train import requested_choices

    plugins = load_plugins()
    for warning in plugins.warnings():  # a broken plugin this run does not use is not fatal
        print(f"warning: {warning}", file=sys.stderr)
    helping = any(a in HELP_FLAGS for a in argv)
    lookups = {"backend": plugins.backend, "runtime": plugins.runtime, "reward": plugins.reward}
    try:
        register_configs(plugins)
        for group, name in requested_choices(argv).items():
            if not helping and group not in skip:
                lookups[group](name)
    except (ConfigError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return plugins


def run_hydra(config_name: str, argv: list[str], body: Callable[[Any], int], *, module: str) -> int:
    """Compose ``config_name`` with ``argv`` as Hydra's command line and return ``body(cfg)``.

    A ``TracerlError`` from ``body`` is printed and gives 1; Hydra's own exits (``--help``,
    a bad override) pass through as they do for any Hydra app. ``module`` is the command's
    module (``core.train``): Hydra names the job after it (``hydra.job.name``, the
    ``<name>.log`` in the run directory, ``<name> is powered by Hydra``).
    """
    import hydra

    from core.config import CONFIG_MODULE, VERSION_BASE

    result: dict[str, int] = {}

    def task(cfg: Any) -> None:
        try:
            result["code"] = body(cfg)
        except TracerlError as exc:
            print(f"error: {exc}", file=sys.stderr)
            result["code"] = 1

    # Hydra takes the job name from the task function's module: make it the command's.
    task.__module__ = module
    entry = hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=config_name, version_base=VERSION_BASE)(task)
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else module, *argv]
    try:
        entry()
    finally:
        sys.argv = saved_argv
    return result.get("code", 0)

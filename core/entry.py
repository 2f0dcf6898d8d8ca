"""What ``python -m core.train`` and ``python -m core.eval`` share before and around Hydra.

- ``load_checked_plugins``: load the plugins, register their config nodes, and look
  up the backend, runtime and reward the command line picks, so an unknown name
  fails with the installed ones listed instead of Hydra's generic error.
- ``requested_choices``: the backend, runtime and reward a command line selects
  (its overrides, else the primary config's defaults), read before Hydra composes.
- ``run_hydra``: compose a primary config from an argument list and run a body on
  it, a ``TracerlError`` printed as ``error: ...`` (exit code 1).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError, PluginError, TracerlError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from core.plugins.manager import Plugins

HELP_FLAGS = ("--help", "-h", "--hydra-help", "--info")
"""Hydra's own flags that print and exit: nothing is looked up for them."""

_GROUP_OVERRIDE = re.compile(r"^(?:\+{1,2})?(backend|runtime|reward)=(?P<value>[^\s]+)$")


def _default_choice(group: str) -> str | None:
    """The default option of ``group`` in the primary config's defaults list."""
    import yaml

    import core.conf

    primary = Path(core.conf.__file__).parent / "train.yaml"
    for entry in yaml.safe_load(primary.read_text()).get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return str(entry[group])
    return None


def requested_choices(argv: list[str]) -> dict[str, str]:
    """Which backend, runtime and reward the command line (or the defaults) select."""
    chosen: dict[str, str] = {}
    for arg in argv:
        match = _GROUP_OVERRIDE.match(arg)
        if match:
            chosen[match.group(1)] = match.group("value")
    for group in ("backend", "runtime", "reward"):
        if group not in chosen:
            default = _default_choice(group)
            if default is not None:
                chosen[group] = default
    return chosen



def load_checked_plugins(argv: list[str], *, skip: Collection[str] = ()) -> Plugins | None:
    """The loaded plugins, or None after printing why the command line cannot run.

    Args:
        argv: The command line's overrides.
        skip: Groups (``backend``, ``runtime``, ``reward``) not to look up, e.g. the
            backend of an evaluation against an endpoint.
    """
    from core.config import register_configs
    from core.plugins import load_plugins

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


def run_hydra(config_name: str, argv: list[str], body: Callable[[DictConfig], int], *, module: str) -> int:
    """Compose ``config_name`` with ``argv`` as Hydra's command line and return ``body(cfg)``.

    A ``TracerlError`` from ``body`` is printed and gives 1; Hydra's own exits (``--help``,
    a bad override) pass through as they do for any Hydra app. ``module`` is the command's
    module (``core.train``): Hydra names the job after it (``hydra.job.name``, the
    ``<name>.log`` in the run directory, ``<name> is powered by Hydra``).
    """
    import hydra

    from core.config import CONFIG_MODULE, VERSION_BASE

    result: dict[str, int] = {}

    def task(cfg: DictConfig) -> None:
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

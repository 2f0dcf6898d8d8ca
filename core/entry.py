"""What ``python -m core.train`` and ``python -m core.eval`` share before and around Hydra.

- ``load_checked_plugins``: load the plugins, register their config nodes, and look
  up the backend, runtime and reward the command line picks, so an unknown name
  fails with the installed ones listed instead of Hydra's generic error.
- ``requested_choices``: the backend, runtime and reward a command line selects
  (its overrides, else the primary config's defaults), read before Hydra composes.
- ``run_hydra``: compose a primary config from an argument list and run a body on
  it, a ``TracerlError`` printed as ``error: ...`` (exit code 1).
- ``resume_argv`` / ``run_argv``: the command line completed with the overrides a run
  directory stored (``core.rundir.runconfig``), for a resume and for eval or export.
"""

from __future__ import annotations

import logging
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


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(flags, overrides)``: Hydra's ``--flags`` and the ``key=value`` overrides."""
    return [a for a in argv if a.startswith("-")], [a for a in argv if not a.startswith("-")]


def _given(overrides: list[str], key: str) -> str | None:
    """The last value ``overrides`` give ``key`` (as typed), or None."""
    from core.rundir.runconfig import override_key

    found = None
    for override in overrides:
        try:
            if override_key(override) == key and "=" in override:
                found = override.split("=", 1)[1]
        except ConfigError:  # not an override Hydra can read: Hydra reports it in its own words
            continue
    return found


def resume_argv(argv: list[str]) -> list[str]:
    """``argv`` of ``python -m core.train``, completed with the run's stored overrides when it resumes.

    Checked here, before Hydra writes anything: the run directory, a complete checkpoint
    in it, and that no override changes what the run trains. Hydra does not rewrite the
    run's ``.hydra/`` on a resume (``hydra.output_subdir=null``): it keeps how the run started.

    Raises:
        ConfigError: no ``run_dir``, no checkpoint to resume, or a conflicting override;
            nothing in the run directory has been touched.
    """
    from core.rundir.checkpoint import latest_checkpoint
    from core.rundir.runconfig import RUN_FILE, read_run_record, resume_overrides

    flags, overrides = _split(argv)
    if str(_given(overrides, "trainer.resume")).lower() != "true":
        return argv
    where = _given(overrides, "run_dir")
    if not where:
        raise ConfigError(
            "trainer.resume=true needs run_dir=<the run to resume> (the directory the run printed); "
            "the default run_dir is a new directory"
        )
    run_dir = Path(where)
    if not run_dir.is_dir():
        raise ConfigError(f"trainer.resume=true but run_dir={where!r} is not a directory; pass the run's run_dir")
    if latest_checkpoint(run_dir) is None:
        raise ConfigError(
            f"trainer.resume=true but {run_dir / 'checkpoints'} holds no complete checkpoint; "
            "set run_dir to the run to resume, or start it afresh in a new run_dir"
        )
    record = read_run_record(run_dir)
    if record is None:
        print(
            f"warning: {run_dir} has no {RUN_FILE} or .hydra/overrides.yaml; the resume uses only "
            "the overrides given here (repeat the run's own)",
            file=sys.stderr,
        )
        merged = overrides
    else:
        merged = resume_overrides(record, overrides)
    return [*flags, *merged, "hydra.output_subdir=null"]


def run_argv(argv: list[str], source: str) -> list[str]:
    """``argv`` completed with the overrides of the run that ``source`` (a run or checkpoint dir) belongs to.

    The run's overrides come first (less its ``run_dir`` and resume), so the command's own win.
    Unchanged when the run stored none.
    """
    from core.rundir.runconfig import read_run_record, reuse_overrides, run_dir_of

    record = read_run_record(run_dir_of(source))
    if record is None:
        return argv
    flags, overrides = _split(argv)
    return [*flags, *reuse_overrides(record, overrides)]


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
    before = list(logging.getLogger().handlers)
    try:
        entry()
    finally:
        sys.argv = saved_argv
        _close_job_log(before)
    return result.get("code", 0)


def _close_job_log(before: list[logging.Handler]) -> None:
    """Close the file handlers the run attached to the root logger (Hydra's ``<name>.log``),
    leaving those that were there before it (a notebook's own log, ``pytest --log-file``).

    Hydra opens the job's log file and never closes it; the next in-process run (a test, a
    notebook) reconfigures logging and drops the handler with its file still open.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and handler not in before:
            root.removeHandler(handler)
            handler.close()

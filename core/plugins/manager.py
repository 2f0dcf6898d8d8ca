"""Building the plugin manager and the registries it fills.

``load_plugins()`` is the one entry point: it blocks the plugins named in
``TRACERL_DISABLE_PLUGINS``, loads the ``tracerl`` entry-point group (unless
``TRACERL_DISABLE_PLUGIN_AUTOLOAD`` is set), registers core's own plugins,
drops plugins with unknown hooks, and calls the registration hooks one
plugin at a time so every spec remembers who registered it. A broken plugin
is recorded, never fatal: commands that do not need it keep working.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pluggy

from core.errors import BackendNotFoundError, ConfigError, PluginError
from core.plugins import hookspecs
from core.plugins.registry import (
    BackendRegistry,
    BackendSpec,
    PluginProblem,
    ProblemKind,
    Registration,
    RewardRegistry,
    RewardSpec,
    RuntimeRegistry,
    RuntimeSpec,
    unknown_keys,
)

ENTRY_POINT_GROUP = "tracerl"
DISABLE_ENV = "TRACERL_DISABLE_PLUGINS"
NO_AUTOLOAD_ENV = "TRACERL_DISABLE_PLUGIN_AUTOLOAD"

# Core's own plugin modules, registered like any third-party plugin.
BUILTIN_PLUGINS: tuple[str, ...] = ("core.runtime.plugin", "core.rewards.plugin")

# Backends that live in this repository but ship as separate distributions:
# when one is asked for and missing, say which install fixes it.
IN_TREE_BACKENDS: dict[str, str] = {
    "local": "tracerl-local",
    "tinker": "tracerl-tinker",
    "sagemaker": "tracerl-sagemaker",
    "verl": "tracerl-verl",
    "slime": "tracerl-slime",
}

# In-tree backends that must not be pip-installed into this environment, and
# what to do instead.
OWN_ENVIRONMENT: dict[str, str] = {
    "verl": (
        "verl 0.9.1 pins transformers<5.11, so it never goes into the environment that runs "
        "the rest of tracerl: build its own with `bash plugins/verl/scripts/setup_venv.sh` "
        "(creates .venv-verl), then `source .venv-verl/bin/activate` and run this command "
        "there (docs/backends/verl.md; `bash plugins/verl/scripts/run_tests.sh` runs its tests)."
    ),
}


DEBUG_ENVS = ("TRACERL_DEBUG", "HYDRA_FULL_ERROR")
"""Either set to ``1`` shows the tracebacks of broken plugins."""


def debug_enabled() -> bool:
    """Whether ``TRACERL_DEBUG=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``) asks for tracebacks."""
    return any(os.environ.get(env, "") not in ("", "0") for env in DEBUG_ENVS)


@dataclass(frozen=True)
class BlockedPlugin:
    """A plugin that ``TRACERL_DISABLE_PLUGINS`` kept from loading."""

    origin: Registration
    """Its entry point (or core module) and distribution."""


@dataclass
class Plugins:
    """The loaded plugin manager with its filled registries (a typed facade).

    Loading never fails because of one plugin: what broke is in ``problems``
    (printed as warnings by the commands), and only looking up a name that
    a broken or blocked plugin would provide raises.
    """

    manager: pluggy.PluginManager
    backends: BackendRegistry
    runtimes: RuntimeRegistry
    rewards: RewardRegistry = field(default_factory=RewardRegistry)
    """Trainer-side reward functions (``reward=<name>``)."""
    load_problems: list[PluginProblem] = field(default_factory=list)
    """Plugins that failed to import or to run their hooks (all their names are unavailable)."""
    blocked: list[BlockedPlugin] = field(default_factory=list)
    """Plugins blocked by ``TRACERL_DISABLE_PLUGINS``."""
    unmatched_blocks: list[str] = field(default_factory=list)
    """Warnings for ``TRACERL_DISABLE_PLUGINS`` entries that match no plugin."""

    @property
    def problems(self) -> list[PluginProblem]:
        """Every problem: plugins that did not load, then rejected backend and runtime names."""
        return [
            *self.load_problems,
            *self.backends.problems(),
            *self.runtimes.problems(),
            *self.rewards.problems(),
        ]

    def warnings(self) -> list[str]:
        """One line per problem and per useless ``TRACERL_DISABLE_PLUGINS`` entry, for the console."""
        lines = [f"{p.message}{_debug_hint(p)}" for p in self.problems]
        return [*lines, *self.unmatched_blocks]

    def backend(self, name: str) -> BackendSpec:
        """The backend registered as ``name``.

        Raises:
            PluginError: the plugin providing ``name`` is broken or the name is
                registered twice; the message names the plugins.
            BackendNotFoundError: ``name`` is blocked, or not installed (naming the
                installed backends and, for an in-tree backend, the ``pip install``).
        """
        spec = self.backends.get(name)
        if spec is not None:
            return spec
        self._raise_if_broken("backend", name)
        installed = tuple(self.backends.names())
        listing = ", ".join(installed) if installed else "none"
        blocked = self._blocked_message("backend", name)
        if blocked:
            hint = blocked
        elif name in OWN_ENVIRONMENT:
            hint = (
                f"backend {name!r} is provided by the {IN_TREE_BACKENDS[name]!r} distribution, "
                f"which is not installed here. {OWN_ENVIRONMENT[name]}"
            )
        elif name in IN_TREE_BACKENDS:
            dist = IN_TREE_BACKENDS[name]
            hint = (
                f"backend {name!r} is provided by the {dist!r} distribution, which is not "
                f"installed. Install it with `pip install -e plugins/{name}` from a tracerl "
                f"checkout (or `pip install {dist}`)."
            )
        else:
            hint = (
                f"unknown backend {name!r}. A third-party backend is a pip-installable plugin "
                f"registering itself in the {ENTRY_POINT_GROUP!r} entry-point group; see "
                "docs/plugins.md."
            )
        raise BackendNotFoundError(
            f"{hint} Installed backends: {listing}.{self._unloaded_note(bool(blocked))}",
            name=name,
            installed=installed,
        )

    def runtime(self, name: str) -> RuntimeSpec:
        """The runtime registered as ``name``.

        Raises:
            PluginError: its plugin is broken or the name is registered twice.
            ConfigError: ``name`` is blocked or unknown (listing the installed runtimes).
        """
        spec = self.runtimes.get(name)
        if spec is not None:
            return spec
        raise self._not_found("runtime", name, self.runtimes.names())

    def reward(self, name: str) -> RewardSpec:
        """The reward function registered as ``name``.

        Raises:
            PluginError: its plugin is broken or the name is registered twice.
            ConfigError: ``name`` is blocked or unknown (listing the installed rewards).
        """
        spec = self.rewards.get(name)
        if spec is not None:
            return spec
        raise self._not_found("reward", name, self.rewards.names())

    def _not_found(self, kind: str, name: str, installed: list[str]) -> ConfigError:
        """The error for a runtime or reward ``name`` that is not usable (PluginError if its plugin is broken)."""
        self._raise_if_broken(kind, name)
        blocked = self._blocked_message(kind, name)
        hint = blocked or f"unknown {kind} {name!r}."
        return ConfigError(
            f"{hint} Installed {kind}s: {', '.join(installed) or 'none'}.{self._unloaded_note(bool(blocked))}"
        )

    def check_config(self, cfg: Any) -> None:
        """Refuse keys in ``cfg.backend`` / ``cfg.runtime`` that their plugin's node lacks.

        Hydra refuses ``backend.log_evry=3`` but accepts ``+backend.log_evry=3``
        (the ``+`` it suggests adds the key); this catches both.

        Raises:
            ConfigError: naming each unknown key, the plugin and the valid keys.
        """
        import difflib

        errors: list[str] = []
        groups: tuple[tuple[str, Any], ...] = (
            ("backend", self.backends),
            ("runtime", self.runtimes),
            ("reward", self.rewards),
        )
        for group, registry in groups:
            given = cfg.get(group) if hasattr(cfg, "get") else None
            name = str(given.get("name")) if given is not None and hasattr(given, "get") else ""
            if name not in registry:
                continue
            origin = registry.origin(name)
            for key, valid in unknown_keys(registry.node(name), given, group):
                leaf = key.rsplit(".", 1)[1]
                close = difflib.get_close_matches(leaf, valid, n=1)
                hint = f" Did you mean {key.rsplit('.', 1)[0]}.{close[0]}?" if close else ""
                errors.append(
                    f"unknown key {key} (with or without Hydra's '+'): {group} {name!r} from "
                    f"{origin.describe()} has no such setting.{hint} "
                    f"Valid keys of {key.rsplit('.', 1)[0]}: {', '.join(valid)}."
                )
        if errors:
            raise ConfigError("\n".join(errors))

    def _raise_if_broken(self, group: str, name: str) -> None:
        registry: Any = {"backend": self.backends, "runtime": self.runtimes, "reward": self.rewards}[group]
        rejected = registry.problems(name)
        if rejected:
            raise PluginError(f"{group} {name!r} is unavailable: {rejected[-1].message}")
        for problem in self.load_problems:
            if name in problem.names:
                raise PluginError(
                    f"{group} {name!r} is unavailable: {problem.message}{_debug_hint(problem)}"
                )

    def _blocked_message(self, group: str, name: str) -> str:
        blocked = [b for b in self.blocked if name == b.origin.plugin or name in _BUILTIN_NAMES.get(
            b.origin.plugin, ()
        )]
        if not blocked:
            return ""
        return (
            f"{group} {name!r} is blocked: {DISABLE_ENV} blocks {blocked[0].origin.describe()}, "
            f"which provides it. Remove {blocked[0].origin.plugin!r} from {DISABLE_ENV} to use it."
        )

    def _unloaded_note(self, said_blocked: bool) -> str:
        """Plugins that did not load and might have provided the name asked for."""
        notes = [
            f" Not loaded, and maybe providing it: {p.origin.describe()}, which failed"
            " (see the warning above or `python -m core.plugins`)."
            for p in self.load_problems
        ]
        if self.blocked and not said_blocked:
            notes.append(
                f" Blocked by {DISABLE_ENV}: {', '.join(b.origin.plugin for b in self.blocked)}."
            )
        return "".join(notes)


# Names core's own plugin modules register, so blocking one explains a missing name.
_BUILTIN_NAMES: dict[str, tuple[str, ...]] = {
    "core.runtime.plugin": ("local", "agentcore"),
    "core.rewards.plugin": ("agent", "match", "math", "judge"),
}


def _debug_hint(problem: PluginProblem) -> str:
    if not problem.detail:
        return ""
    if debug_enabled():
        return f"\n{problem.detail}"
    return " Set TRACERL_DEBUG=1 for the traceback."


def _blocked_names() -> list[str]:
    raw = os.environ.get(DISABLE_ENV, "")
    return list(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))


@dataclass(frozen=True)
class _EntryPoint:
    name: str
    module: str
    distribution: str
    version: str
    load: Callable[[], Any]


def _entry_points() -> tuple[list[_EntryPoint], list[PluginProblem]]:
    """Every entry point of the group, first distribution wins (as pluggy does), and a
    problem for each entry-point name a second, different distribution also claims.

    ``entry_points(group=...)`` reads only each distribution's entry-point file, and the
    metadata of the few that declare ours; walking ``distributions()`` read every one's
    metadata, a tenth of a second per process start in a full environment."""
    import importlib.metadata

    out: dict[str, _EntryPoint] = {}
    clashes: list[PluginProblem] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        dist_name = dist.metadata["name"] if dist is not None else "?"
        version = dist.version if dist is not None else "?"
        first = out.get(ep.name)
        if first is not None:
            if first.distribution != dist_name:  # the same one twice on sys.path is harmless
                loser = Registration(ep.name, dist_name, version, ep.value)
                clashes.append(
                    PluginProblem(
                        kind="duplicate",
                        origin=loser,
                        message=(
                            f"entry point {ep.name!r} is claimed by distribution "
                            f"{first.distribution} {first.version} ({first.module}) and by "
                            f"{dist_name} {version} ({ep.value}); only {first.distribution}'s "
                            f"is loaded. Uninstall the one you do not want."
                        ),
                    )
                )
            continue
        out[ep.name] = _EntryPoint(
            name=ep.name,
            module=ep.value,
            distribution=dist_name,
            version=version,
            load=ep.load,
        )
    return list(out.values()), clashes


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame outside the import machinery."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")
    ]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _load_problem(kind: ProblemKind, origin: Registration, what: str, exc: BaseException) -> PluginProblem:
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return PluginProblem(
        kind=kind,
        origin=origin,
        message=(
            f"{origin.describe()} {what}: {type(exc).__name__}: {exc}{_where(exc)}. "
            f"Its backends and runtimes are unavailable; everything else works. "
            f"Fix or uninstall {origin.distribution or 'it'}, or block it with "
            f"{DISABLE_ENV}={origin.plugin}."
        ),
        names=(origin.plugin,),
        detail=detail,
    )


def _unknown_hooks(pm: pluggy.PluginManager) -> dict[str, list[str]]:
    """Plugin name -> hooks it implements that no spec declares."""
    out: dict[str, list[str]] = {}
    for hook_name in list(pm.hook.__dict__):
        if hook_name.startswith("_"):
            continue
        caller = getattr(pm.hook, hook_name)
        if caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if not impl.optionalhook:
                out.setdefault(impl.plugin_name, []).append(hook_name)
    return out


def _match_blocks(
    blocks: list[str], entry_points: list[_EntryPoint]
) -> tuple[list[BlockedPlugin], list[str]]:
    """Which plugins the blocked names hit, and a warning for each name that hits none."""
    by_name = {ep.name: ep for ep in entry_points}
    hit: list[BlockedPlugin] = []
    unmatched: list[str] = []
    known = sorted({*by_name, *BUILTIN_PLUGINS})
    for name in blocks:
        if name in by_name:
            ep = by_name[name]
            hit.append(BlockedPlugin(Registration(ep.name, ep.distribution, ep.version, ep.module)))
            continue
        if name in BUILTIN_PLUGINS:
            hit.append(BlockedPlugin(Registration(name, module=name)))
            continue
        meant = [
            ep.name
            for ep in entry_points
            if name in (ep.distribution, ep.module, ep.module.split(":")[0].split(".")[0])
            or name.replace("_", "-") == ep.distribution.replace("_", "-")
        ]
        hint = (
            f"; it looks like the distribution or module of plugin {meant[0]!r}: "
            f"use {DISABLE_ENV}={meant[0]}"
            if meant
            else f"; plugin names are entry-point names: {', '.join(known)}"
        )
        unmatched.append(f"{DISABLE_ENV}: {name!r} matches no plugin, so it blocks nothing{hint}")
    return hit, unmatched


def load_plugins(*, extra_plugins: tuple[Any, ...] = ()) -> Plugins:
    """Build the plugin manager and fill the backend and runtime registries.

    One broken plugin does not stop the others: a plugin that fails to import,
    implements an unknown hook or raises in a hook is dropped and recorded in
    ``Plugins.load_problems``; a rejected registration is recorded in its
    registry. Only asking for a name they would provide raises.

    Args:
        extra_plugins: Plugin objects to register as well (tests use this).
    """
    import importlib

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    blocks = _blocked_names()
    for name in blocks:
        pm.set_blocked(name)
    entry_points, problems = _entry_points() if not os.environ.get(NO_AUTOLOAD_ENV) else ([], [])
    blocked, unmatched = _match_blocks(blocks, entry_points)
    origins: dict[str, Registration] = {}

    for module_name in BUILTIN_PLUGINS:
        if pm.is_blocked(module_name):
            continue
        pm.register(importlib.import_module(module_name), name=module_name)
        origins[module_name] = Registration(plugin=module_name, module=module_name)
    for ep in entry_points:
        if pm.is_blocked(ep.name) or pm.get_plugin(ep.name) is not None:
            continue
        origin = Registration(ep.name, ep.distribution, ep.version, ep.module)
        try:
            plugin = ep.load()
        except Exception as exc:  # an import error inside someone's plugin
            problems.append(_load_problem("import", origin, "failed to import", exc))
            continue
        try:
            pm.register(plugin, name=ep.name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            problems.append(_load_problem("hooks", origin, "has invalid hooks", exc))
            continue
        origins[ep.name] = origin
    for plugin in extra_plugins:
        registered = pm.register(plugin)
        if registered is not None:
            origins[registered] = Registration(plugin=registered)
    for plugin_name, hook_names in _unknown_hooks(pm).items():
        origin = origins.get(plugin_name, Registration(plugin=plugin_name))
        pm.unregister(name=plugin_name)
        problems.append(
            PluginProblem(
                kind="hooks",
                origin=origin,
                message=(
                    f"{origin.describe()} implements unknown hooks {sorted(hook_names)!r} "
                    "(a typo, or a hook of a newer tracerl); the plugin is not used. Known hooks: "
                    f"{', '.join(sorted(n for n in dir(hookspecs) if n.startswith('tracerl_')))}."
                ),
                names=(plugin_name,),
            )
        )

    backends, runtimes, rewards = BackendRegistry(), RuntimeRegistry(), RewardRegistry()
    for plugin_name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked
            continue
        origin = origins.get(plugin_name, Registration(plugin=plugin_name))
        others = [p for p in pm.get_plugins() if p is not plugin]
        for hook_name, registry in (
            ("tracerl_register_backends", backends),
            ("tracerl_register_runtimes", runtimes),
            ("tracerl_register_rewards", rewards),
        ):
            caller = pm.subset_hook_caller(hook_name, remove_plugins=others)
            registry._current = origin
            try:
                caller(registry=registry)
            except Exception as exc:
                backends.discard_plugin(plugin_name)
                runtimes.discard_plugin(plugin_name)
                rewards.discard_plugin(plugin_name)
                problems.append(_load_problem("hooks", origin, f"failed in {hook_name}", exc))
                break
        backends._current = runtimes._current = rewards._current = replace(origin, plugin="<direct>")
    return Plugins(
        manager=pm,
        backends=backends,
        runtimes=runtimes,
        rewards=rewards,
        load_problems=problems,
        blocked=blocked,
        unmatched_blocks=unmatched,
    )

"""Registries that plugins fill through the registration hooks.

Defines ``BackendSpec``, ``RuntimeSpec`` and ``RewardSpec`` (what a plugin registers),
``BackendRegistry`` / ``RuntimeRegistry`` / ``RewardRegistry`` (typed facades that check every
registration and remember which plugin and distribution registered what) and
``PluginProblem`` (one broken plugin or registration, worded for the user).

A bad registration does not raise: it is recorded as a problem against its
name, so one broken plugin leaves every other backend usable, and only a run
that selects the broken name fails, with the problem's message.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from core.errors import PluginError

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

BackendKind = Literal["driven", "driving"]


@dataclass(frozen=True)
class BackendSpec:
    """A training backend, as a plugin registers it."""

    name: str
    """Name users pick with ``backend=<name>``."""
    kind: BackendKind
    """``driven``: core runs the loop over the backend's training primitives.
    ``driving``: the backend's own trainer runs (verl, slime)."""
    factory: Callable[[Any], Any]
    """Called with the composed config; returns a ``TrainingBackend`` (driven)
    or a ``DrivingBackend`` (driving). Import heavy dependencies inside it."""
    config: Any
    """Default Hydra node for ``backend/<name>``: a dataclass type or instance
    (type-checked overrides) or a plain dict."""
    description: str = ""
    """One line shown by ``python -m core.plugins``."""
    multi_policy: bool = False
    """The backend trains several policies in one run (``policies`` with more than one
    entry, docs/multi_agent.md); without it such a run is refused at start-up."""
    policy_settings: tuple[str, ...] = ()
    """Settings of the backend's config node (dotted keys, e.g. ``lora.rank``) a policy may set
    for itself under ``policies.<name>.backend``; any other key is refused at start-up, naming
    it. Empty: every policy trains the run's ``backend`` settings."""
    check_policy: Callable[[Any, list[str]], None] | None = None
    """Called at start-up with a policy's backend node (the run's with the policy's settings
    over it) and the dotted keys the policy set; raises ``ValueError`` (``ConfigError``) for
    a combination the backend cannot honour (a LoRA rank with LoRA off)."""


@dataclass(frozen=True)
class RuntimeSpec:
    """A rollout runtime, as a plugin registers it."""

    name: str
    """Name users pick with ``runtime=<name>``."""
    factory: Callable[[Any], Any]
    """Called with the composed config; returns a ``RolloutRuntime``."""
    config: Any
    """Default Hydra node for ``runtime/<name>``."""
    description: str = ""
    """One line shown by ``python -m core.plugins``."""


@dataclass(frozen=True)
class RewardSpec:
    """A trainer-side reward function, as a plugin registers it."""

    name: str
    """Name users pick with ``reward=<name>``."""
    factory: Callable[[Any], Any]
    """Called with the composed config (its ``reward`` node is this spec's); returns a
    ``core.rewards.RewardFunction`` (or None: the agent's own reward stands)."""
    config: Any
    """Default Hydra node for ``reward/<name>``; subclass ``core.rewards.RewardConfig``
    (``mode``, ``component``, ``timeout_s``)."""
    description: str = ""
    """One line shown by ``python -m core.plugins``."""


@dataclass(frozen=True)
class Registration:
    """Who registered a spec: the plugin and, when installed, its distribution."""

    plugin: str
    """Plugin name in the manager (the entry-point name for installed plugins)."""
    distribution: str | None = None
    """Distribution that provides the plugin, e.g. ``tracerl-local``."""
    version: str | None = None
    """Version of that distribution."""
    module: str | None = None
    """What the entry point points at, e.g. ``tracerl_local.plugin``."""

    def describe(self) -> str:
        """``plugin 'x' (entry point x = pkg.mod, distribution pkg 1.0)``: every name a user needs."""
        parts = []
        if self.module:
            parts.append(f"entry point {self.plugin} = {self.module}")
        if self.distribution:
            parts.append(f"distribution {self.distribution} {self.version or '?'}")
        where = f" ({', '.join(parts)})" if parts else ""
        return f"plugin {self.plugin!r}{where}"


ProblemKind = Literal["import", "hooks", "registration", "duplicate", "config"]


@dataclass(frozen=True)
class PluginProblem:
    """One broken plugin or rejected registration, worded for the person who must act."""

    kind: ProblemKind
    """``import``: the module failed to import; ``hooks``: unknown or failing hooks;
    ``registration``/``config``/``duplicate``: one registered name was rejected."""
    origin: Registration
    """The plugin at fault (for a duplicate: the second one)."""
    message: str
    """What is wrong, naming the plugin, and what to do."""
    group: str | None = None
    """``backend`` or ``runtime`` when the problem is about one registered name."""
    names: tuple[str, ...] = ()
    """Names the problem makes unusable (for a plugin that did not load: its entry-point name)."""
    detail: str = ""
    """The traceback, shown with ``TRACERL_DEBUG=1``."""


SpecT = TypeVar("SpecT", BackendSpec, RuntimeSpec, RewardSpec)


def _block_hint(origin: Registration) -> str:
    if origin.distribution is None:  # registered directly (tests), nothing to block
        return ""
    return f" Until it is fixed, TRACERL_DISABLE_PLUGINS={origin.plugin} silences it."


def config_node(kind: str, name: str, config: Any) -> Any:
    """The Hydra node (an OmegaConf ``DictConfig``) for a spec's ``config``.

    Fills ``name`` when absent. Raises ``PluginError`` for a config that is
    neither a dataclass nor a dict, or whose ``name`` differs from ``name``.
    """
    from omegaconf import DictConfig, OmegaConf

    node: DictConfig
    if dataclasses.is_dataclass(config):
        node = OmegaConf.structured(config)
    elif isinstance(config, dict | DictConfig):
        node = OmegaConf.create(config)
    else:
        raise PluginError(
            f"{kind} {name!r}: config must be a dataclass or a dict, got {type(config).__name__}"
        )
    declared = node.get("name") if "name" in node else None
    if declared is None or OmegaConf.is_missing(node, "name"):
        OmegaConf.set_struct(node, False)
        node.name = name
        OmegaConf.set_struct(node, True)
    elif declared != name:
        raise PluginError(
            f"{kind} {name!r} ships a config whose name is {declared!r}; the config's "
            f"`name` must equal the registered name (set name={name!r} in the config, "
            "or leave the field out and it is filled in)"
        )
    return node


def unknown_keys(default: Any, given: Any, path: str) -> list[tuple[str, list[str]]]:
    """Keys of ``given`` that ``default`` lacks, as ``(dotted key, valid keys there)``.

    Descends into nested dataclass nodes only: a plain ``dict`` field inside a
    dataclass (``env``, ``sampler``) is free-form by design and takes any key.
    """
    from omegaconf import DictConfig, OmegaConf

    out: list[tuple[str, list[str]]] = []
    valid = sorted(str(k) for k in default.keys())
    for key in given.keys():
        if key not in default:
            out.append((f"{path}.{key}", valid))
            continue
        sub_default, sub_given = default._get_node(key), given._get_node(key)
        if (
            isinstance(sub_default, DictConfig)
            and isinstance(sub_given, DictConfig)
            and not sub_default._is_none()
            and not sub_given._is_none()
            and dataclasses.is_dataclass(OmegaConf.get_type(sub_default))
        ):
            out.extend(unknown_keys(sub_default, sub_given, f"{path}.{key}"))
    return out


@dataclass
class _Registry(Generic[SpecT]):
    kind: str
    _specs: dict[str, SpecT] = field(default_factory=dict)
    _origins: dict[str, Registration] = field(default_factory=dict)
    _nodes: dict[str, Any] = field(default_factory=dict)
    _rejected: dict[str, list[PluginProblem]] = field(default_factory=dict)
    _dupes: dict[str, list[tuple[Registration, SpecT]]] = field(default_factory=dict)
    _current: Registration = field(default_factory=lambda: Registration(plugin="<direct>"))

    def add(self, spec: SpecT) -> None:
        """Register ``spec``.

        A malformed name raises ``PluginError`` (the loader records it against the
        plugin). A config whose ``name`` differs, or a name another plugin already
        registered, is recorded as a problem for that name instead: every other
        name stays usable and a run selecting this one fails naming the plugins.
        """
        origin = self._current
        if not isinstance(spec.name, str) or not _NAME_RE.match(spec.name):
            raise PluginError(
                f"{origin.describe()} registered a {self.kind} named {spec.name!r}; "
                "names must be lower-case letters, digits, '-' or '_', starting with a letter"
            )
        name = spec.name
        if name in self._dupes:
            self._dupes[name].append((origin, spec))
            self._mark_duplicate(name)
            return
        if name in self._specs:
            first = (self._origins.pop(name), self._specs.pop(name))
            self._nodes.pop(name, None)
            self._dupes[name] = [first, (origin, spec)]
            self._mark_duplicate(name)
            return
        bad_kind = getattr(spec, "kind", "driven") not in ("driven", "driving")
        if bad_kind or not callable(spec.factory):
            what = (
                f"kind {getattr(spec, 'kind', None)!r} (use 'driven' or 'driving')"
                if bad_kind
                else f"factory {spec.factory!r}, which is not callable"
            )
            self._reject(
                PluginProblem(
                    "registration", origin,
                    f"{origin.describe()} registered {self.kind} {name!r} with {what}."
                    f"{_block_hint(origin)}",
                    self.kind, (name,),
                )
            )
            return
        try:
            node = config_node(self.kind, name, spec.config)
        except PluginError as exc:
            self._reject(
                PluginProblem(
                    "config", origin, f"{origin.describe()}: {exc}.{_block_hint(origin)}",
                    self.kind, (name,),
                )
            )
            return
        self._specs[name] = spec
        self._origins[name] = origin
        self._nodes[name] = node

    def _mark_duplicate(self, name: str) -> None:
        owners = [o for o, _ in self._dupes[name]]
        others = ",".join(dict.fromkeys(o.plugin for o in owners[1:]))
        message = (
            f"{self.kind} {name!r} is registered by {' and by '.join(o.describe() for o in owners)}; "
            f"uninstall all but one, or block the others with TRACERL_DISABLE_PLUGINS={others}"
        )
        self._rejected[name] = [p for p in self._rejected.get(name, []) if p.kind != "duplicate"]
        self._reject(PluginProblem("duplicate", owners[-1], message, self.kind, (name,)))

    def _reject(self, problem: PluginProblem) -> None:
        for name in problem.names:
            self._rejected.setdefault(name, []).append(problem)

    def discard_plugin(self, plugin: str) -> None:
        """Forget everything ``plugin`` registered (its hook failed half-way)."""
        for name in [n for n, o in self._origins.items() if o.plugin == plugin]:
            del self._specs[name], self._origins[name]
            self._nodes.pop(name, None)
        for name in list(self._rejected):
            kept = [p for p in self._rejected[name] if p.origin.plugin != plugin]
            self._rejected[name] = kept
        for name, owners in list(self._dupes.items()):
            left = [(o, s) for o, s in owners if o.plugin != plugin]
            if len(left) == len(owners):
                continue
            del self._dupes[name]
            self._rejected[name] = [p for p in self._rejected[name] if p.kind != "duplicate"]
            saved = self._current
            for origin, spec in left:  # re-register the survivors as if the culprit never had
                self._current = origin
                self.add(spec)
            self._current = saved
        for name in [n for n, ps in self._rejected.items() if not ps]:
            del self._rejected[name]

    def get(self, name: str) -> SpecT | None:
        """The spec registered under ``name``, or None."""
        return self._specs.get(name)

    def origin(self, name: str) -> Registration:
        """Which plugin and distribution registered ``name``."""
        return self._origins[name]

    def node(self, name: str) -> Any:
        """A copy of the validated default Hydra node (``DictConfig``) of ``name``."""
        return copy.deepcopy(self._nodes[name])

    def problems(self, name: str | None = None) -> list[PluginProblem]:
        """Rejected registrations: of ``name``, or all of them (sorted by name)."""
        if name is not None:
            return list(self._rejected.get(name, []))
        return [p for n in sorted(self._rejected) for p in self._rejected[n]]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._specs)

    def __iter__(self) -> Iterator[SpecT]:
        return iter(self._specs[n] for n in self.names())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs


class BackendRegistry(_Registry[BackendSpec]):
    """Training backends by name. Passed to ``tracerl_register_backends``."""

    def __init__(self) -> None:
        super().__init__(kind="backend")


class RuntimeRegistry(_Registry[RuntimeSpec]):
    """Rollout runtimes by name. Passed to ``tracerl_register_runtimes``."""

    def __init__(self) -> None:
        super().__init__(kind="runtime")


class RewardRegistry(_Registry[RewardSpec]):
    """Trainer-side reward functions by name. Passed to ``tracerl_register_rewards``."""

    def __init__(self) -> None:
        super().__init__(kind="reward")

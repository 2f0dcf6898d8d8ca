"""Registries that plugins fill through the registration hooks.

Defines ``BackendSpec`` and ``RuntimeSpec`` (what a plugin registers) and
``BackendRegistry`` / ``RuntimeRegistry`` (typed facades that check names and
remember which plugin and distribution registered what).
"""

from __future__ import annotations

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
class Registration:
    """Who registered a spec: the plugin and, when installed, its distribution."""

    plugin: str
    """Plugin name in the manager (the entry-point name for installed plugins)."""
    distribution: str | None = None
    """Distribution that provides the plugin, e.g. ``tracerl-local``."""
    version: str | None = None
    """Version of that distribution."""


SpecT = TypeVar("SpecT", BackendSpec, RuntimeSpec)


@dataclass
class _Registry(Generic[SpecT]):
    kind: str
    _specs: dict[str, SpecT] = field(default_factory=dict)
    _origins: dict[str, Registration] = field(default_factory=dict)
    _current: Registration = field(default_factory=lambda: Registration(plugin="<direct>"))

    def add(self, spec: SpecT) -> None:
        """Register ``spec``; a duplicate or malformed name raises ``PluginError``."""
        if not _NAME_RE.match(spec.name):
            raise PluginError(
                f"plugin {self._current.plugin!r} registered a {self.kind} named {spec.name!r}; "
                "names must be lower-case letters, digits, '-' or '_', starting with a letter"
            )
        if spec.name in self._specs:
            first = self._origins[spec.name].plugin
            raise PluginError(
                f"{self.kind} {spec.name!r} is registered twice: by plugin {first!r} and by "
                f"plugin {self._current.plugin!r}; uninstall one or block it with "
                "TRACERL_DISABLE_PLUGINS"
            )
        self._specs[spec.name] = spec
        self._origins[spec.name] = self._current

    def get(self, name: str) -> SpecT | None:
        """The spec registered under ``name``, or None."""
        return self._specs.get(name)

    def origin(self, name: str) -> Registration:
        """Which plugin and distribution registered ``name``."""
        return self._origins[name]

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

"""``python -m core.plugins new NAME``: write a working plugin distribution to start from.

Two kinds, both small and both passing their conformance suite as written:

- ``runtime`` (default): ``runtime=NAME`` delegating to tracerl's local process
  pool, with one setting of its own; tested with ``RuntimeConformance``.
- ``backend``: ``backend=NAME``, a driven backend extending ``LocalBackend``
  (needs ``tracerl-local``); tested with ``BackendConformance``.

Replace the delegation with your own infrastructure and keep the tests green.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from core.plugins.registry import _NAME_RE

__all__ = ["KINDS", "scaffold"]

KINDS = ("runtime", "backend")

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tracerl-{name}"
version = "0.1.0"
description = "{title} {kind} for tracerl"
requires-python = ">=3.11"
dependencies = [{dependencies}]

[project.optional-dependencies]
test = ["pytest"]

# `python -m core.plugins` finds the plugin through this entry point; its name is
# what TRACERL_DISABLE_PLUGINS blocks.
[project.entry-points.tracerl]
{name} = "{package}.plugin"

[tool.setuptools.packages.find]
include = ["{package}*"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

_README = '''\
# tracerl-{name}

`{kind}={name}` for tracerl, written by `python -m core.plugins new {name} --kind {kind}`.

```console
$ pip install -e '.[test]'
$ python -m core.plugins --check      # imports the plugin, validates its registration
$ python -m pytest                    # the {kind} conformance suite
$ python -m core.train {kind}={name} ...
```

Settings: `{package}/plugin.py` (`{classname}Config`, overridden as `{kind}.<field>=...`).
'''

_RUNTIME_PLUGIN = '''\
"""Registers ``runtime={name}``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.plugins import RuntimeRegistry, RuntimeSpec, hookimpl
from core.runtime import LocalRuntimeConfig


@dataclass
class {classname}Config:
    """The ``runtime/{name}`` node: ``runtime.<field>=...`` on the command line."""

    name: str = "{name}"
    slow_rollout_s: float = 0.0
    """Log a warning for rollouts slower than this (0: never)."""
    pool: LocalRuntimeConfig = field(default_factory=LocalRuntimeConfig)
    """The local process pool this runtime delegates to (``runtime.pool.num_processes=4``)."""


def make_runtime(cfg: Any) -> Any:
    """Factory: gets the whole composed config (``cfg.runtime``, ``cfg.task.agent``, ...)."""
    from {package}.runtime import {classname}Runtime  # heavy imports here, not at registration

    return {classname}Runtime.from_config(cfg)


@hookimpl
def tracerl_register_runtimes(registry: RuntimeRegistry) -> None:
    registry.add(
        RuntimeSpec(
            name="{name}",
            factory=make_runtime,
            config={classname}Config,
            description="{title}: the local process pool, logging slow rollouts",
        )
    )
'''

_RUNTIME_IMPL = '''\
"""``{classname}Runtime``: a ``core.interfaces.RolloutRuntime``.

It delegates to tracerl's local process pool; replace each method with your
own infrastructure and keep ``tests/test_{package}_conformance.py`` green.
"""

from __future__ import annotations

import logging
from typing import Any

from core.runtime import LocalRuntime
from core.types import RolloutRequest, RolloutResult

logger = logging.getLogger(__name__)


class {classname}Runtime:
    def __init__(self, pool: LocalRuntime, *, slow_rollout_s: float = 0.0) -> None:
        self._pool = pool
        self._slow_rollout_s = slow_rollout_s

    @classmethod
    def from_config(cls, cfg: Any) -> {classname}Runtime:
        pool = LocalRuntime.from_config(cfg, node=cfg.runtime.pool)
        return cls(pool, slow_rollout_s=float(cfg.runtime.slow_rollout_s))

    async def start(self) -> None:
        await self._pool.start()

    async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
        # Never raise for agent faults: return a failed RolloutResult (the pool does).
        result = await self._pool.run_rollout(request)
        if self._slow_rollout_s and result.elapsed_s > self._slow_rollout_s:
            logger.warning("rollout %s took %.1fs", request.rollout_id, result.elapsed_s)
        return result

    async def cancel(self, rollout_id: str) -> None:
        await self._pool.cancel(rollout_id)

    async def aclose(self) -> None:
        await self._pool.aclose()
'''

_RUNTIME_TEST = '''\
"""``runtime={name}`` passes tracerl's runtime conformance suite."""

from __future__ import annotations

from typing import Any

import pytest

from core.testing import CONFORMANCE_AGENT, RuntimeConformance, build_runtime


class Test{classname}Conformance(RuntimeConformance):
    @pytest.fixture
    def runtime(self) -> Any:
        # built as a run builds it: the installed plugin's factory over the composed config
        return build_runtime(
            "{name}", [f"task.agent={{CONFORMANCE_AGENT}}", "runtime.pool.num_processes=1"]
        )
'''

_BACKEND_PLUGIN = '''\
"""Registers ``backend={name}``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracerl_local import LocalBackendConfig

from core.plugins import BackendRegistry, BackendSpec, hookimpl


@dataclass
class {classname}Config:
    """The ``backend/{name}`` node: ``backend.<field>=...`` on the command line."""

    name: str = "{name}"
    log_every: int = 0
    """Print the loss every N forward/backward calls (0: never)."""
    local: LocalBackendConfig = field(default_factory=LocalBackendConfig)
    """The local torch backend this one extends (``backend.local.model=...``)."""


def make_backend(cfg: Any) -> Any:
    """Factory: gets the whole composed config (``cfg.backend``, ``cfg.seed``, ``cfg.task``, ...)."""
    from {package}.backend import {classname}Backend  # torch is imported here, not at registration

    return {classname}Backend.from_config(cfg)


@hookimpl
def tracerl_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            name="{name}",
            kind="driven",
            factory=make_backend,
            config={classname}Config,
            description="{title}: the local torch backend, printing its loss",
        )
    )
'''

_BACKEND_IMPL = '''\
"""``{classname}Backend``: a ``core.interfaces.TrainingBackend`` extending ``LocalBackend``.

Override the primitives you change and keep ``tests/test_{package}_conformance.py`` green.
"""

from __future__ import annotations

from typing import Any

from tracerl_local import LocalBackend

from core.types import ForwardBackwardResult


class {classname}Backend(LocalBackend):
    name = "{name}"

    @classmethod
    def from_config(cls, cfg: Any, *, node: Any = None) -> {classname}Backend:
        backend = super().from_config(cfg, node=cfg.backend.local if node is None else node)
        assert isinstance(backend, cls)
        backend.log_every = int(cfg.backend.log_every)
        backend.calls = 0
        return backend

    async def forward_backward(self, *args: Any, **kwargs: Any) -> ForwardBackwardResult:
        result = await super().forward_backward(*args, **kwargs)
        self.calls += 1
        if self.log_every and self.calls % self.log_every == 0:
            print(f"{name}: loss {{result.metrics['loss']:.4f}}")
        return result
'''

_BACKEND_TEST = '''\
"""``backend={name}`` passes tracerl's backend conformance suite."""

from __future__ import annotations

from typing import Any

import pytest

from core.testing import BackendConformance, build_backend


class Test{classname}Conformance(BackendConformance):
    logprob_atol = 1e-4

    @pytest.fixture
    def backend(self) -> Any:
        # built as a run builds it: the installed plugin's factory over the composed config
        return build_backend("{name}", ["backend.local.tiny.num_layers=1"])
'''


def scaffold(name: str, dest: Path, kind: str = "runtime") -> Path:
    """Write distribution ``tracerl-<name>`` under ``dest``; returns its folder.

    Raises:
        ValueError: a bad name or kind, or the folder exists already.
    """
    if not _NAME_RE.match(name):
        raise ValueError(
            f"plugin name {name!r}: use lower-case letters, digits, '-' or '_', starting with a letter"
        )
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
    package = "tracerl_" + re.sub(r"[^a-z0-9]", "_", name)
    classname = "".join(part.capitalize() for part in re.split(r"[-_]", name) if part)
    root = dest / f"tracerl-{name}"
    if root.exists():
        raise ValueError(f"{root} exists already; pick another --dest or name")
    values = {
        "name": name,
        "package": package,
        "classname": classname,
        "kind": kind,
        "title": classname,
        "dependencies": '"tracerl"' if kind == "runtime" else '"tracerl", "tracerl-local"',
    }
    plugin, impl, test = (
        (_RUNTIME_PLUGIN, _RUNTIME_IMPL, _RUNTIME_TEST)
        if kind == "runtime"
        else (_BACKEND_PLUGIN, _BACKEND_IMPL, _BACKEND_TEST)
    )
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"{package}/__init__.py": '"""tracerl-{name}: `{kind}={name}` for tracerl."""\n',
        f"{package}/plugin.py": plugin,
        f"{package}/{kind}.py": impl,
        f"tests/test_{package}_conformance.py": test,
    }
    for rel, template in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**values))
    return root


def main(name: str, dest: str, kind: str) -> int:
    """CLI body: write the distribution and say what to run next."""
    try:
        root = scaffold(name, Path(dest), kind)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {root}")
    print(f"next: pip install -e '{root}[test]' && python -m core.plugins --check && python -m pytest {root}")
    return 0

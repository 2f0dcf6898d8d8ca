"""Test support for tracerl and for third-party plugin authors.

Public names (``__all__``), imported on first use so ``import core.testing``
stays cheap and does not need pytest until a suite is used:

- ``BackendConformance``: the driven-backend conformance suite (``core.testing.conformance``);
  ``MultiPolicyConformance`` its case for a backend that declares ``multi_policy``.
- ``RuntimeConformance``: the rollout-runtime fault-contract suite
  (``core.testing.runtime_conformance``); runtimes serve ``CONFORMANCE_AGENT``.
- ``build_backend`` / ``build_runtime`` / ``compose_config``: build a registered
  backend or runtime inside a test, from the config ``python -m core.train`` composes.
- ``datum_from_sample``: the datum core builds for a one-turn row.
- ``core.testing.pytest_plugin``: fixtures, loaded with ``-p core.testing.pytest_plugin``.
- ``core.testing.agentcore_standin``: a local stand-in for the AgentCore Runtime data
  plane (``python -m core.testing.agentcore_standin my_agent:app``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CONFORMANCE_AGENT",
    "BackendConformance",
    "MultiPolicyConformance",
    "RuntimeConformance",
    "build_backend",
    "build_runtime",
    "compose_config",
    "conformance_request",
    "datum_from_sample",
]

_WHERE = {
    "CONFORMANCE_AGENT": "core.testing.conformance_agent",
    "BackendConformance": "core.testing.conformance",
    "MultiPolicyConformance": "core.testing.conformance",
    "datum_from_sample": "core.testing.conformance",
    "RuntimeConformance": "core.testing.runtime_conformance",
    "conformance_request": "core.testing.runtime_conformance",
    "build_backend": "core.testing.build",
    "build_runtime": "core.testing.build",
    "compose_config": "core.testing.build",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'core.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

"""Fixtures for the local backend tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from local_helpers import run
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig


@pytest.fixture
def make_backend() -> Iterator[Callable[..., LocalBackend]]:
    """Build tiny backends (seed and config overrides as keywords); closed after the test."""
    built: list[LocalBackend] = []

    def factory(seed: int = 0, **overrides: Any) -> LocalBackend:
        backend = LocalBackend(replace(LocalBackendConfig(), **overrides), seed=seed)
        built.append(backend)
        return backend

    yield factory
    for backend in built:
        run(backend.aclose())

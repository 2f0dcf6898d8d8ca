"""Fixtures: the real local inference server, a reference local sampler, stand-in engines.

The local inference server (``tracerl_local.serve``) serves the tiny model
built from seed 0; the reference backend builds the same weights in process,
so the HTTP samplers' tokens and logprobs can be compared with the
``LocalSampler``'s for the same per-request seed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig
from tracerl_local.serve import InferenceServer

from tests.samplers.servers import BackgroundLoop, StandIn, UvicornApp


@dataclass
class LocalServer:
    """A running ``tracerl_local.serve`` server and the backend behind it."""

    server: InferenceServer
    backend: LocalBackend
    bg: BackgroundLoop

    @property
    def url(self) -> str:
        return self.server.url

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/tracerl/stats", timeout=10).json()  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def bg() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


def _start_local(bg: BackgroundLoop, **overrides: Any) -> LocalServer:
    backend = LocalBackend(LocalBackendConfig(**overrides), seed=0)
    server = InferenceServer(backend, model_name="tiny")
    bg.run(server.start())
    return LocalServer(server, backend, bg)


def _stop_local(local: LocalServer) -> None:
    local.bg.run(local.server.stop())
    local.bg.run(local.backend.aclose())


@pytest.fixture(scope="session")
def local_server(bg: BackgroundLoop) -> Iterator[LocalServer]:
    """The local inference server (tiny model, seed 0) on 127.0.0.1."""
    local = _start_local(bg)
    yield local
    _stop_local(local)


@pytest.fixture(scope="session")
def slow_local_server(bg: BackgroundLoop) -> Iterator[LocalServer]:
    """Like ``local_server`` but requests wait 400 ms in the batch queue: time to cancel them."""
    local = _start_local(bg, batch_wait_ms=400.0)
    yield local
    _stop_local(local)


@pytest.fixture(scope="session")
def reference() -> Iterator[LocalBackend]:
    """The same tiny model in process: its ``LocalSampler`` is the reference."""
    backend = LocalBackend(LocalBackendConfig(), seed=0)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture
def make_standin(bg: BackgroundLoop) -> Iterator[Callable[..., tuple[StandIn, str]]]:
    """Factory: ``make_standin(mode=..., ...)`` -> (stand-in, its URL); stopped after the test."""
    running: list[UvicornApp] = []

    def make(**kw: Any) -> tuple[StandIn, str]:
        standin = StandIn(**kw)
        server = UvicornApp(standin.app())
        bg.run(server.start())
        running.append(server)
        return standin, server.url

    yield make
    for server in running:
        bg.run(server.stop())

"""Pushing weights to inference servers: SGLang's update-from-disk and vLLM's reload, version checks,
servers that fail the update.

Every server here is the real local inference server (``tracerl_local.serve``)
with the weight-update endpoints the engines have; the weights pushed come
from another local backend (seed 1), so after the push the server must sample
exactly what that backend's own sampler samples.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig, TinyModelConfig
from tracerl_local.serve import InferenceServer
from tracerl_local.weights_io import export_weights

from core.errors import ConfigError, RunAborted
from core.samplers import HttpSamplerConfig, build_http_sampler
from core.samplers.weights import WeightPusher
from core.types import SamplingParams
from tests.samplers.servers import BackgroundLoop

PROMPT = [3, 4, 5, 6]
PARAMS = SamplingParams(max_tokens=6, temperature=1.0, seed=11)


class Fleet:
    """Fresh servers for one test (pushes change their weights, so none is shared)."""

    def __init__(self, bg: BackgroundLoop) -> None:
        self.bg = bg
        self.servers: list[tuple[InferenceServer, LocalBackend]] = []

    def start(self, **overrides: Any) -> str:
        backend = LocalBackend(LocalBackendConfig(**overrides), seed=0)
        server = InferenceServer(backend, model_name="tiny")
        self.bg.run(server.start())
        self.servers.append((server, backend))
        return server.url

    def close(self) -> None:
        for server, backend in self.servers:
            self.bg.run(server.stop())
            self.bg.run(backend.aclose())


@pytest.fixture
def fleet(bg: BackgroundLoop) -> Iterator[Fleet]:
    f = Fleet(bg)
    yield f
    f.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBackend, str]]:
    """Weights other than the servers' (seed 1), exported as version 7."""
    backend = LocalBackend(LocalBackendConfig(), seed=1)
    path = export_weights(backend.model, tmp_path_factory.mktemp("weights") / "v7", 7)
    yield backend, path
    asyncio.run(backend.aclose())


def _expected(backend: LocalBackend) -> Any:
    async def go() -> Any:
        return await backend.sampler.sample(PROMPT, PARAMS, session_id="ref")

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_push_serves_the_new_weights_at_the_new_version(
    fleet: Fleet, trained: tuple[LocalBackend, str], kind: str
) -> None:
    backend, path = trained
    url = fleet.start()
    sampler = build_http_sampler(HttpSamplerConfig(kind=kind, urls=[url], health_interval_s=0))
    expected = _expected(backend)

    async def go() -> tuple[Any, Any, Any]:
        before = await sampler.sample(PROMPT, PARAMS, session_id="s")
        report = await WeightPusher(sampler).push(path, 7)
        after = await sampler.sample(PROMPT, PARAMS, session_id="s")
        await sampler.aclose()
        return before, report, after

    before, report, after = asyncio.run(go())
    assert report.updated == [url] and not report.retired
    assert (before.token_ids, before.logprobs) != (expected.token_ids, expected.logprobs)
    assert after.token_ids == expected.token_ids
    assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert after.weight_version == 7 and before.weight_version == 0
    assert httpx.get(url + "/get_weight_version", timeout=10).json() == {"weight_version": "7"}


def test_a_server_that_fails_the_update_leaves_rotation(
    fleet: Fleet, trained: tuple[LocalBackend, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, path = trained
    good = fleet.start()
    other = fleet.start(tiny=TinyModelConfig(hidden_size=32))  # the pushed weights do not fit
    sampler = build_http_sampler(HttpSamplerConfig(kind="sglang", urls=[good, other], health_interval_s=0))

    async def go() -> tuple[Any, list[Any]]:
        report = await WeightPusher(sampler).push(path, 7)
        results = [await sampler.sample(PROMPT, PARAMS, session_id=f"s{i}") for i in range(8)]
        await sampler.aclose()
        return report, results

    report, results = asyncio.run(go())
    assert report.updated == [good]
    assert "do not fit the served model" in report.retired[other]
    assert [s.url for s in sampler.pool.servers] == [good]
    assert {r.weight_version for r in results} == {7}  # every session moved to the updated server
    err = capsys.readouterr().err
    assert f"SGLang server {other} failed the weight update to version 7" in err
    assert "1 server(s) left" in err
    # The refused server kept serving its own weights (the update rolled back).
    assert httpx.get(other + "/get_weight_version", timeout=10).json() == {"weight_version": "0"}


def test_no_server_left_aborts_the_run_with_the_reasons(fleet: Fleet, trained: tuple[LocalBackend, str]) -> None:
    _, path = trained
    url = fleet.start(tiny=TinyModelConfig(hidden_size=32))
    sampler = build_http_sampler(HttpSamplerConfig(kind="vllm", urls=[url], health_interval_s=0))

    async def go() -> None:
        try:
            await WeightPusher(sampler).push(path, 7)
        finally:
            await sampler.aclose()

    with pytest.raises(RunAborted) as err:
        asyncio.run(go())
    message = str(err.value)
    assert "no inference server is left" in message
    assert f"{url}: POST /collective_rpc answered HTTP 500" in message
    assert "do not fit the served model" in message


def test_a_missing_directory_is_refused_and_named(fleet: Fleet, tmp_path: Path) -> None:
    url = fleet.start()
    sampler = build_http_sampler(HttpSamplerConfig(kind="sglang", urls=[url], health_interval_s=0))

    async def go() -> None:
        try:
            await WeightPusher(sampler).push(str(tmp_path / "nowhere"), 1)
        finally:
            await sampler.aclose()

    with pytest.raises(RunAborted, match="is not a directory this server can read"):
        asyncio.run(go())


def test_sampler_errors_name_the_training_config_keys() -> None:
    from core.trainer.fleet import SamplerConfig

    with pytest.raises(ConfigError, match=r"sampler\.urls is empty; .*sampler\.urls='\["):
        build_http_sampler(SamplerConfig(kind="sglang"))
    with pytest.raises(ConfigError, match=r"HttpSamplerConfig\.urls is empty"):
        build_http_sampler(HttpSamplerConfig(kind="sglang"))


def test_a_push_during_a_request_leaves_that_request_on_its_version(slow_local_server: Any) -> None:
    """vLLM reports no version: a request sent before the sampler's version moved keeps the old
    one (the server's batch started on the old weights), so async staleness is not understated."""
    sampler = build_http_sampler(
        HttpSamplerConfig(kind="vllm", urls=[slow_local_server.url], health_interval_s=0)
    )

    async def go() -> Any:
        task = asyncio.ensure_future(sampler.sample(PROMPT, PARAMS, session_id="s"))
        while slow_local_server.stats()["in_flight"] == 0:
            await asyncio.sleep(0.02)
        sampler.weight_version = 9  # what WeightPusher does once every server has version 9
        result = await task
        later = await sampler.sample(PROMPT, PARAMS, session_id="s")
        await sampler.aclose()
        return result, later

    result, later = asyncio.run(go())
    assert (result.weight_version, later.weight_version) == (0, 9)


def test_update_timeout_bounds_a_servers_whole_update(bg: BackgroundLoop) -> None:
    """vLLM's update is three calls: ``update_timeout_s`` is their total, not each one's. The
    server is a stand-in for vLLM's edge (no vLLM in CI) whose every call takes 0.3 s: each is
    within 0.5 s, all three are not."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tests.samplers.servers import UvicornApp

    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(0.3)
        return JSONResponse({})

    app = Starlette(routes=[Route("/collective_rpc", slow, methods=["POST"]),
                            Route("/reset_prefix_cache", slow, methods=["POST"])])
    server = UvicornApp(app)
    bg.run(server.start())
    sampler = build_http_sampler(HttpSamplerConfig(kind="vllm", urls=[server.url], health_interval_s=0))

    async def go() -> None:
        try:
            await WeightPusher(sampler, update_timeout_s=0.5).push("/weights/v3", 3)
        finally:
            await sampler.aclose()

    try:
        with pytest.raises(RunAborted, match=r"did not finish within sampler\.update_timeout_s=0\.5s"):
            asyncio.run(go())
    finally:
        bg.run(server.stop())


LONG_GREEDY = SamplingParams(max_tokens=400, temperature=0)
"""A generation long enough for a push to land in it (greedy: references are exact)."""


@pytest.mark.parametrize("continue_aborted", [True, False])
def test_a_push_that_aborts_running_requests_continues_them_on_the_new_weights(
    fleet: Fleet, trained: tuple[LocalBackend, str], reference: LocalBackend, continue_aborted: bool
) -> None:
    """Partial rollouts over HTTP (#28): with ``abort_on_push`` SGLang's update aborts the
    running request, which answers its tokens so far with finish reason ``abort``; the
    sampler sends prompt + those tokens again and the turn goes on under the pushed weights,
    one segment per version, each token with the logprob of the weights that sampled it."""
    backend, path = trained
    url = fleet.start(batch_wait_ms=0.0)
    served = fleet.servers[-1][1]
    sampler = build_http_sampler(HttpSamplerConfig(
        kind="sglang", urls=[url], health_interval_s=0, abort_on_push=True, continue_aborted=continue_aborted,
    ))

    async def go() -> Any:
        start = served.sampler.stats.forward_calls
        task = asyncio.ensure_future(sampler.sample(PROMPT, LONG_GREEDY, session_id="s"))
        while served.sampler.stats.forward_calls < start + 20:  # the generation is under way
            await asyncio.sleep(0.005)
        await WeightPusher(sampler).push(path, 7)
        result = await task
        await sampler.aclose()
        return result

    out = asyncio.run(go())
    assert served.sampler.stats.interrupted == 1
    old = asyncio.run(reference.sampler.sample(PROMPT, LONG_GREEDY, session_id="ref"))
    if not continue_aborted:
        assert out.finish_reason.value == "abort" and not out.segments and out.weight_version == 0
        k = len(out.token_ids)
        assert 20 <= k < LONG_GREEDY.max_tokens and out.token_ids == old.token_ids[:k]
        return
    assert out.weight_version == 0 and [g.weight_version for g in out.segments] == [0, 7], out.segments
    first, second = out.segments
    k = first.end
    assert 20 <= k < len(out.token_ids) <= LONG_GREEDY.max_tokens
    # Part 1 is what the launch weights generate; part 2 what the pushed ones (the seed-1
    # backend) generate after prompt + part 1, with their logprobs.
    assert out.token_ids[:k] == old.token_ids[:k]
    assert out.logprobs[:k] == pytest.approx(old.logprobs[:k], abs=1e-5)
    rest = asyncio.run(backend.sampler.sample(
        [*PROMPT, *out.token_ids[:k]], SamplingParams(max_tokens=LONG_GREEDY.max_tokens - k, temperature=0),
        session_id="ref"))
    assert out.token_ids[k:] == rest.token_ids and second == type(second)(k, len(out.token_ids), 7)
    assert out.logprobs[k:] == pytest.approx(rest.logprobs, abs=1e-5)

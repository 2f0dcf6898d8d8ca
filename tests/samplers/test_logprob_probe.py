"""The fleet's logprob probe: every server's logprobs on a fixed prompt against the trainer's.

The trainer is a real ``LocalBackend`` and the fleet the real local inference
server (``tracerl_local.serve``), both built from seed 0, so the probe compares
two real computations. The refusal uses a stand-in for vLLM's network edge in
its default ``raw_logprobs`` mode (``tests/samplers/servers.py``; no vLLM in CI):
tokens sampled at the requested temperature by the local server, logprobs
reported as the raw model's, as vLLM does unless started with
``--logprobs-mode processed_logprobs``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig
from tracerl_local.serve import InferenceServer

from core.errors import ConfigError, RunAborted
from core.trainer.fleet import Fleet, FleetProbe, SamplerConfig, build_fleet
from core.types import SamplingParams
from tests.samplers.servers import BackgroundLoop

TEMPERATURE = 0.4
"""Far from 1: the untrained tiny model's distributions are flat, so tempering them moves the
probe's logprobs by 0.26 nats per token at 0.4 (0.06 at 0.7); a trained model's peaked
distributions move far more."""


@pytest.fixture
def served(bg: BackgroundLoop) -> Iterator[tuple[str, LocalBackend]]:
    """A fresh local inference server (seed 0) and the backend behind it."""
    backend = LocalBackend(LocalBackendConfig(), seed=0)
    server = InferenceServer(backend, model_name="tiny")
    bg.run(server.start())
    yield server.url, backend
    bg.run(server.stop())
    bg.run(backend.aclose())


@pytest.fixture
def trainer() -> Iterator[LocalBackend]:
    backend = LocalBackend(LocalBackendConfig(), seed=0)
    yield backend
    asyncio.run(backend.aclose())


def _fleet(kind: str, url: str, tmp_path: Path) -> Fleet:
    config = SamplerConfig(kind=kind, urls=[url], health_interval_s=0, processed_logprobs=True)
    probe = FleetProbe("ppo", {"temperature": TEMPERATURE}, SamplingParams(temperature=TEMPERATURE))
    return Fleet(config, tmp_path, probe=probe)


async def _push(fleet: Fleet, backend: LocalBackend) -> Any:
    try:
        return await fleet.push(backend)
    finally:
        await fleet.aclose()


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_server_reporting_the_sampled_distribution_passes(
    served: tuple[str, LocalBackend], trainer: LocalBackend, tmp_path: Path, kind: str
) -> None:
    url, _ = served
    fleet = _fleet(kind, url, tmp_path)
    report = asyncio.run(_push(fleet, trainer))
    assert report.updated == [url] and not report.retired
    (result,) = fleet.probed
    assert result.tokens > 0 and result.mean_abs_diff < 1e-3
    assert fleet.metrics()["sampler/probe_logprob_diff"] == result.mean_abs_diff


def test_the_probe_refuses_a_server_reporting_raw_logprobs_at_another_temperature(
    served: tuple[str, LocalBackend], trainer: LocalBackend, make_standin: Any, tmp_path: Path
) -> None:
    """The user declared processed logprobs, but the server reports the raw model's: at
    temperature 0.4 every ratio would be wrong, so the run stops before any rollout."""
    upstream, upstream_backend = served
    standin, url = make_standin(upstream=upstream, raw_logprobs_from=upstream_backend)
    fleet = _fleet("vllm", url, tmp_path)
    with pytest.raises(RunAborted) as err:
        asyncio.run(_push(fleet, trainer))
    (result,) = fleet.probed
    assert result.tokens > 0 and result.mean_abs_diff > fleet.config.logprob_tolerance
    message = str(err.value)
    assert "no inference server reports the trainer's logprobs at temperature=0.4" in message
    assert "sampler.logprob_tolerance=0.1" in message and "--logprobs-mode processed_logprobs" in message
    assert standin.generate_hits()[0].body["sampling_params"]["temperature"] == TEMPERATURE


def test_settings_an_engine_reports_unnormalised_are_refused_unless_declared(tmp_path: Path) -> None:
    class Backend:
        name = "local"

        async def export_weights(self, path: str) -> str:
            return path

    def cfg(kind: str, *extra: tuple[str, Any]) -> Any:
        node = OmegaConf.create({"backend": {"name": "local"}, "sampler": {"kind": kind, "urls": ["http://a:1"]},
                                 "algorithm": {"loss": "ppo", "temperature": 1.0, "loss_config": {}}})
        for key, value in extra:
            OmegaConf.update(node, key, value)
        return node

    with pytest.raises(ConfigError, match=r"sampler=vllm with algorithm.temperature=0.7: vLLM reports the raw"):
        build_fleet(cfg("vllm", ("algorithm.temperature", 0.7)), Backend(), tmp_path)
    with pytest.raises(ConfigError, match=r"algorithm.loss_config.top_p=0.9: SGLang reports logprobs after"):
        build_fleet(cfg("sglang", ("algorithm.loss_config.top_p", 0.9)), Backend(), tmp_path)
    # SGLang applies the temperature to what it reports; a declaration lifts the refusal
    assert build_fleet(cfg("sglang", ("algorithm.temperature", 0.7)), Backend(), tmp_path) is not None
    declared = cfg("vllm", ("algorithm.temperature", 0.7), ("sampler.processed_logprobs", True))
    fleet = build_fleet(declared, Backend(), tmp_path)
    assert fleet is not None and fleet.probe is not None
    assert fleet.probe.params.temperature == 0.7 and fleet.probe.loss_config["temperature"] == 0.7


def test_a_server_that_cannot_answer_the_probe_is_retired(
    served: tuple[str, LocalBackend], trainer: LocalBackend, make_standin: Any, tmp_path: Path
) -> None:
    """It took the weights, then fails every generation (a stand-in answering 500)."""
    good, _ = served
    _, broken = make_standin(mode="http500")
    config = SamplerConfig(kind="vllm", urls=[good, broken], health_interval_s=0, processed_logprobs=True)
    probe = FleetProbe("ppo", {"temperature": TEMPERATURE}, SamplingParams(temperature=TEMPERATURE))
    fleet = Fleet(config, tmp_path, probe=probe)
    report = asyncio.run(_push(fleet, trainer))
    assert report.updated == [good]
    assert "the probe request failed" in report.retired[broken] and "HTTP 500" in report.retired[broken]
    assert [s.url for s in fleet.sampler.pool.servers] == [good]
    assert [r.url for r in fleet.probed] == [good]


@pytest.mark.parametrize("raw_after_restart", [False, True])
def test_a_server_coming_back_is_probed_before_any_traffic(
    served: tuple[str, LocalBackend], trainer: LocalBackend, make_standin: Any, tmp_path: Path,
    raw_after_restart: bool,
) -> None:
    """A server that restarts between pushes is re-pushed on coming back and probed then,
    against the last push's trainer logprobs, not at the next push (#28). Here it passes
    the push's probe, then restarts without ``--logprobs-mode processed_logprobs`` (raw
    logprobs at temperature 0.4): retired before it serves a turn; restarted as it was, it
    is readmitted."""
    good, upstream_backend = served
    standin, url = make_standin(upstream=good)
    config = SamplerConfig(kind="vllm", urls=[good, url], health_interval_s=0, processed_logprobs=True)
    probe = FleetProbe("ppo", {"temperature": TEMPERATURE}, SamplingParams(temperature=TEMPERATURE))
    fleet = Fleet(config, tmp_path, probe=probe)
    pool = fleet.sampler.pool

    async def go() -> Any:
        try:
            report = await fleet.push(trainer)
            assert sorted(report.updated) == sorted([good, url]) and not report.retired
            # It restarts: down for a check, then back (the health-check path readmits it).
            standin.restart()
            standin.raw_logprobs_from = upstream_backend if raw_after_restart else None
            server = next(s for s in pool.servers if s.url == url)
            pool.record_check(server, False, "down")
            pool.record_check(server, False, "down")
            served_before = len(standin.generate_hits())
            await pool.check(fleet.sampler.client(), server)
            return server, served_before
        finally:
            await fleet.aclose()

    server, served_before = asyncio.run(go())
    assert standin.weights != "launch"  # re-pushed on coming back
    assert len(standin.generate_hits()) == served_before + 1  # the probe, before any turn
    if raw_after_restart:
        assert [s.url for s in pool.servers] == [good]
        (reason,) = [r for s, r in fleet.pusher.retired.items() if s == url]
        assert "logprobs differ from the trainer's" in reason and "sampler.logprob_tolerance=0.1" in reason
        assert max(r.mean_abs_diff for r in fleet.probed if r.url == url) > config.logprob_tolerance
    else:
        assert server in pool.servers and not server.needs_weights
        assert [r.mean_abs_diff for r in fleet.probed if r.url == url][-1] < 1e-3

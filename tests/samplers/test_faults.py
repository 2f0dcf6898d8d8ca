"""Faults at the inference servers' edge, against stand-in engines (see tests/samplers/servers.py).

Refused connections are retried then reported; HTTP error answers are never
retried; malformed answers, missing logprobs and hangs become ``SamplerError``
naming the server; a dead server among several is routed around; cancelling
a caller reaches SGLang's ``/abort_request`` with the request's own rid.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from core.errors import ConfigError, SamplerError
from core.samplers import HttpSamplerConfig, build_http_sampler
from core.samplers.http_sampler import HttpSampler, affinity_key
from core.types import FinishReason, SampleResult, SamplingParams
from tests.samplers.servers import dead_url

PARAMS = SamplingParams(max_tokens=8)


def sampler_for(kind: str, urls: list[str], **kw: Any) -> HttpSampler:
    kw.setdefault("health_interval_s", 0)
    kw.setdefault("retry_backoff_s", 0.01)
    return build_http_sampler(HttpSamplerConfig(kind=kind, urls=urls, **kw))


async def _sample(sampler: HttpSampler, session_id: str = "tr-secret-session") -> SampleResult:
    try:
        return await sampler.sample([1, 2, 3], PARAMS, session_id=session_id)
    finally:
        await sampler.aclose()


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_refused_connections_are_retried_then_reported(kind: str) -> None:
    url = dead_url()
    sampler = sampler_for(kind, [url], connect_retries=2)
    t0 = time.monotonic()
    with pytest.raises(SamplerError) as err:
        asyncio.run(_sample(sampler))
    assert sampler.pool.servers[0].requests == 3  # 1 + 2 retries
    msg = str(err.value)
    assert "after 3 attempts" in msg and url in msg and "HttpSamplerConfig.urls" in msg
    assert time.monotonic() - t0 < 5


def test_refused_server_is_skipped_for_a_live_one(make_standin: Any) -> None:
    standin, url = make_standin()
    dead = dead_url()
    sampler = sampler_for("sglang", [dead, url])
    # A session whose preferred server is the dead one.
    sid = next(
        f"s{i}" for i in range(100) if sampler.pool.ranked(affinity_key(f"s{i}"))[0].url == dead
    )
    result = asyncio.run(_sample(sampler, sid))
    assert result.token_ids == standin.tokens
    assert [s.healthy for s in sampler.pool.servers] == [False, True]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_http_500_is_not_retried(make_standin: Any, kind: str) -> None:
    standin, url = make_standin(mode="http500")
    with pytest.raises(SamplerError) as err:
        asyncio.run(_sample(sampler_for(kind, [url], connect_retries=3)))
    assert len(standin.generate_hits()) == 1
    msg = str(err.value)
    assert url in msg and "HTTP 500" in msg and "device-side assert" in msg and "not retried" in msg


@pytest.mark.parametrize(
    ("kind", "mode", "words"),
    [
        ("vllm", "malformed", "malformed JSON"),
        ("sglang", "malformed", "malformed JSON"),
        ("vllm", "no_logprobs", "lacks per-token logprobs"),
        ("sglang", "no_logprobs", "no meta_info.output_token_logprobs"),
    ],
)
def test_bad_answers_name_the_server_and_the_problem(
    make_standin: Any, kind: str, mode: str, words: str
) -> None:
    _, url = make_standin(mode=mode)
    with pytest.raises(SamplerError) as err:
        asyncio.run(_sample(sampler_for(kind, [url])))
    assert words in str(err.value) and url in str(err.value)


def test_a_hang_ends_at_the_request_timeout(make_standin: Any) -> None:
    standin, url = make_standin(mode="hang")
    t0 = time.monotonic()
    with pytest.raises(SamplerError) as err:
        asyncio.run(_sample(sampler_for("sglang", [url], request_timeout_s=0.5)))
    assert 0.4 < time.monotonic() - t0 < 5
    assert "request_timeout_s=0.5" in str(err.value)
    assert len(standin.generate_hits()) == 1  # a hang is not retried


def test_vllm_404_suggests_the_completions_endpoint(make_standin: Any) -> None:
    _, url = make_standin()
    with pytest.raises(SamplerError) as err:
        asyncio.run(_sample(sampler_for("vllm", [url], vllm_endpoint="completions")))
    assert "HTTP 404" in str(err.value)
    _, url = make_standin()
    sampler = sampler_for("vllm", [url + "/v1"])  # a common mistake: the OpenAI base URL
    with pytest.raises(SamplerError) as err:
        asyncio.run(_sample(sampler))
    assert "vllm_endpoint=completions" in str(err.value)


@pytest.mark.parametrize(
    ("kind", "header"), [("vllm", "x-session-id"), ("sglang", "x-smg-routing-key")]
)
def test_affinity_header_is_a_hash_of_the_session_never_the_id(
    make_standin: Any, kind: str, header: str
) -> None:
    standin, url = make_standin()
    asyncio.run(_sample(sampler_for(kind, [url], api_key="k3y"), "tr-secret-session"))
    (hit,) = standin.generate_hits()
    assert hit.headers[header] == affinity_key("tr-secret-session")
    assert "tr-secret-session" not in str(hit.headers) and "tr-secret-session" not in str(hit.body)
    assert hit.headers["authorization"] == "Bearer k3y"


def test_request_bodies_follow_the_engines_shapes(make_standin: Any) -> None:
    standin, url = make_standin()
    params = SamplingParams(
        max_tokens=5, temperature=0.5, top_k=4, stop=("END",), stop_token_ids=(9,), seed=3
    )

    async def go() -> None:
        for kind in ("vllm", "sglang"):
            s = sampler_for(
                kind, [url], return_routed_experts=True, extra_sampling_params={"min_p": 0.1}
            )
            await s.sample([1, 2, 3], params, session_id="s")
            await s.aclose()

    asyncio.run(go())
    vllm, sglang = (h.body for h in standin.generate_hits())
    assert vllm["token_ids"] == [1, 2, 3] and vllm["request_id"].startswith("tracerl-")
    sp = vllm["sampling_params"]
    assert (sp["max_tokens"], sp["temperature"], sp["top_k"], sp["logprobs"]) == (5, 0.5, 4, 1)
    assert (sp["stop"], sp["stop_token_ids"], sp["seed"], sp["min_p"]) == (["END"], [9], 3, 0.1)
    assert sglang["input_ids"] == [1, 2, 3] and sglang["return_logprob"] is True
    assert sglang["return_routed_experts"] is True and sglang["rid"].startswith("tracerl-")
    sp = sglang["sampling_params"]
    assert (sp["max_new_tokens"], sp["sampling_seed"], sp["no_stop_trim"], sp["min_p"]) == (
        5,
        3,
        True,
        0.1,
    )


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_weight_version_and_routed_experts_reach_the_result(make_standin: Any, kind: str) -> None:
    # continue_aborted=False: the stand-in answers every request aborted, and this test reads
    # one answer (a generation continued after aborts is tested in test_weight_push.py).
    _, url = make_standin(weight_version="12", routed_experts="AAAAAQ==", mode="abort_finish")
    result = asyncio.run(_sample(sampler_for(kind, [url], weight_version=3, continue_aborted=False)))
    assert result.routed_experts is not None and result.routed_experts["data"] == "AAAAAQ=="
    assert result.weight_version == (12 if kind == "sglang" else 3)
    assert result.finish_reason is FinishReason.ABORT
    assert result.logprobs == [-0.5, -1.5, -2.5]


def test_dead_server_is_marked_unhealthy_and_traffic_moves(make_standin: Any) -> None:
    """Health checks (configurable interval/timeout/thresholds) take a server out and put it back."""
    a, url_a = make_standin(name="a")
    b, url_b = make_standin(name="b")
    sampler = sampler_for(
        "vllm",
        [url_a, url_b],
        health_interval_s=0.05,
        health_timeout_s=0.5,
        unhealthy_after=2,
        healthy_after=2,
    )
    sessions = [f"s{i}" for i in range(16)]
    on_a = [sid for sid in sessions if sampler.pool.ranked(affinity_key(sid))[0].url == url_a]
    assert 0 < len(on_a) < len(sessions)

    async def wait_for(cond: Any) -> None:
        for _ in range(200):
            if cond():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out: {sampler.pool.snapshot()}")

    async def go() -> None:
        try:
            for sid in sessions:
                await sampler.sample([1], PARAMS, session_id=sid)
            assert len(a.generate_hits()) == len(on_a)  # sticky by session
            a.health_status = 503
            await wait_for(lambda: not sampler.pool.servers[0].healthy)
            hits_a = len(a.generate_hits())
            for sid in sessions:
                await sampler.sample([1], PARAMS, session_id=sid)
            assert len(a.generate_hits()) == hits_a  # everything went to b
            assert len(b.generate_hits()) == 2 * len(sessions) - len(on_a)
            a.health_status = 200
            await wait_for(lambda: sampler.pool.servers[0].healthy)
            for sid in on_a:
                await sampler.sample([1], PARAMS, session_id=sid)
            assert len(a.generate_hits()) == hits_a + len(on_a)  # they came back home
        finally:
            await sampler.aclose()

    asyncio.run(go())
    assert "HTTP 503" in sampler.pool.servers[0].last_error


def test_cancel_reaches_sglang_abort_request_with_the_rid(make_standin: Any) -> None:
    standin, url = make_standin(mode="hang")

    async def go() -> None:
        sampler = sampler_for("sglang", [url])
        task = asyncio.create_task(sampler.sample([1, 2], PARAMS, session_id="s"))
        while not standin.started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sampler.aclose()  # waits (bounded) for the abort call

    asyncio.run(go())
    (hit,) = standin.generate_hits()
    assert standin.aborted == [hit.body["rid"]]


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="HttpSamplerConfig.urls is empty"):
        build_http_sampler({"kind": "sglang"})
    with pytest.raises(ConfigError, match="'tgi'"):
        build_http_sampler({"kind": "tgi", "urls": ["http://x"]})
    with pytest.raises(ConfigError, match="unknown sampler keys \\['url'\\]"):
        build_http_sampler({"kind": "vllm", "url": "http://x"})
    with pytest.raises(ConfigError, match="must start with http"):
        build_http_sampler({"kind": "vllm", "urls": ["localhost:8000"]})
    with pytest.raises(ConfigError, match="vllm_endpoint"):
        build_http_sampler({"kind": "vllm", "urls": ["http://x"], "vllm_endpoint": "chat"})
    with pytest.raises(ConfigError, match="unhealthy_after must be >= 1"):
        build_http_sampler({"kind": "vllm", "urls": ["http://x"], "unhealthy_after": 0})


def test_an_always_aborting_server_is_sent_the_generation_again_a_bounded_number_of_times(make_standin: Any) -> None:
    """A server that answers every request aborted with tokens (an operator aborting, not a
    push) gets the generation again with those tokens appended at most MAX_CONTINUATIONS
    times, each with max_tokens reduced; the turn then ends aborted with every part joined."""
    from core.samplers.http_sampler import MAX_CONTINUATIONS

    standin, url = make_standin(weight_version="12", mode="abort_finish")
    sampler = sampler_for("sglang", [url])

    async def go() -> SampleResult:
        try:
            return await sampler.sample([1, 2, 3], SamplingParams(max_tokens=100), session_id="s")
        finally:
            await sampler.aclose()

    result = asyncio.run(go())
    sent = [h.body for h in standin.hits if h.path == "/generate"]
    assert len(sent) == 1 + MAX_CONTINUATIONS
    assert [len(b["input_ids"]) for b in sent[:3]] == [3, 6, 9]  # each time with the tokens so far
    assert [b["sampling_params"]["max_new_tokens"] for b in sent[:3]] == [100, 97, 94]
    assert result.finish_reason is FinishReason.ABORT and len(result.token_ids) == 3 * len(sent)
    assert result.weight_version == 12 and not result.segments  # one version: no segments

"""The fleet never mixes weights: refused vLLM cache resets, SGLang's launch version after a
push, servers that restart, the per-version cache salt.

The servers are stand-ins for the engines' network edge (``tests/samplers/servers.py``;
no vLLM or SGLang in CI) that behave as the engines' sources say: vLLM refuses a
prefix-cache reset with 409 while running requests hold KV blocks unless asked to
preempt them; SGLang reports ``"default"`` for its launch weights; a restarted engine
serves its launch weights again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from core.errors import SamplerError
from core.samplers import HttpSamplerConfig, build_http_sampler
from core.samplers.http_sampler import HttpSampler, affinity_key
from core.samplers.weights import WeightPusher
from core.types import SamplingParams

PARAMS = SamplingParams(max_tokens=4)
WEIGHTS = "/shared/weights/v000007"


def sampler_for(kind: str, urls: list[str], **kw: Any) -> HttpSampler:
    kw.setdefault("health_interval_s", 0)
    kw.setdefault("retry_backoff_s", 0.01)
    return build_http_sampler(HttpSamplerConfig(kind=kind, urls=urls, **kw))


async def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def session_on(sampler: HttpSampler, url: str) -> str:
    """A session id the pool routes to ``url`` first."""
    return next(
        sid for sid in (f"s{i}" for i in range(1000)) if sampler.pool.ranked(affinity_key(sid))[0].url == url
    )


def test_a_refused_vllm_reset_is_retried_preempting_the_running_requests(make_standin: Any) -> None:
    standin, url = make_standin(mode="hold")
    sampler = sampler_for("vllm", [url])

    async def go() -> Any:
        running = asyncio.create_task(sampler.sample([1, 2], PARAMS, session_id="s"))
        await wait_for(lambda: standin.running == 1, "a running request")
        report = await WeightPusher(sampler, reset_backoff_s=0.01).push(WEIGHTS, 7)
        standin.release.set()
        await running
        await sampler.aclose()
        return report

    report = asyncio.run(go())
    resets = [h.body["query"] for h in standin.hits if h.path == "/reset_prefix_cache"]
    assert resets == ["", "reset_running_requests=true"]  # refused (409), then preempting
    assert standin.resets == ["reset_running_requests=true"] and standin.preempted == 1
    assert report.updated == [url] and not report.retired
    assert sampler.weight_version == 7 and standin.weights == WEIGHTS


def test_a_server_that_keeps_refusing_the_reset_is_retired(make_standin: Any) -> None:
    broken, url_broken = make_standin(name="broken", reset="broken")
    good, url_good = make_standin(name="good")
    sampler = sampler_for("vllm", [url_broken, url_good])

    async def go() -> Any:
        report = await WeightPusher(sampler, reset_attempts=3, reset_backoff_s=0.01).push(WEIGHTS, 7)
        results = [await sampler.sample([1], PARAMS, session_id=f"s{i}") for i in range(6)]
        await sampler.aclose()
        return report, results

    report, results = asyncio.run(go())
    assert report.updated == [url_good]
    assert "/reset_prefix_cache was refused 3 times" in report.retired[url_broken]
    assert [s.url for s in sampler.pool.servers] == [url_good]
    assert not broken.generate_hits() and len(good.generate_hits()) == 6
    assert {r.weight_version for r in results} == {7}


def test_vllm_requests_are_salted_with_their_weight_version(make_standin: Any) -> None:
    """Even where a reset silently did nothing (older vLLM answered 200 regardless), a
    turn labelled with the new version cannot hit KV blocks computed under the old one."""
    standin, url = make_standin(reset="silent", mode="hold")
    sampler = sampler_for("vllm", [url])

    async def go() -> None:
        running = asyncio.create_task(sampler.sample([1, 2], PARAMS, session_id="s"))
        await wait_for(lambda: standin.running == 1, "a running request")
        await WeightPusher(sampler).push(WEIGHTS, 7)
        standin.release.set()
        await running
        await sampler.sample([1, 2], PARAMS, session_id="s")
        await sampler.aclose()

    asyncio.run(go())
    assert standin.resets == []  # the reset was refused without a word
    before, after = (h.body["cache_salt"] for h in standin.generate_hits())
    assert (before, after) == ("tracerl-v0", "tracerl-v7")


def test_sglang_default_after_a_push_is_a_mismatch_and_the_turn_moves(make_standin: Any) -> None:
    """A server that restarted between health checks answers with its launch version
    ``"default"``: the answer is discarded, the request goes to a server with the pushed
    weights, and the restarted one gets them again before it serves anything."""
    a, url_a = make_standin(name="a", weight_version="default")
    b, url_b = make_standin(name="b", weight_version="default")
    sampler = sampler_for("sglang", [url_a, url_b], health_interval_s=0.05)
    sid = session_on(sampler, url_a)

    async def go() -> Any:
        await WeightPusher(sampler).push(WEIGHTS, 7)
        a.restart()  # between two health checks: the pool never saw it down
        moved = await sampler.sample([1], PARAMS, session_id=sid)
        await wait_for(lambda: not sampler.pool.servers[0].needs_weights, "the re-push of a")
        back = await sampler.sample([1], PARAMS, session_id=sid)
        await sampler.aclose()
        return moved, back

    moved, back = asyncio.run(go())
    assert moved.weight_version == 7 and back.weight_version == 7
    assert a.served_with == ["launch", WEIGHTS]  # the launch answer was discarded, never returned
    assert b.served_with == [WEIGHTS]
    pushes = [h.body["weight_version"] for h in a.hits if h.path == "/update_weights_from_disk"]
    assert pushes == ["7", "7"] and a.weight_version == "7"


def test_sglang_default_with_no_other_server_is_refused_with_the_reason(make_standin: Any) -> None:
    a, url = make_standin(weight_version="default")
    sampler = sampler_for("sglang", [url])

    async def go() -> None:
        await WeightPusher(sampler).push(WEIGHTS, 7)
        a.restart()
        try:
            await sampler.sample([1], PARAMS, session_id="s")
        finally:
            await sampler.aclose()

    with pytest.raises(SamplerError) as err:
        asyncio.run(go())
    assert "weight_version='default' although weight version 7 was pushed" in str(err.value)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_restarted_server_gets_the_current_weights_before_any_traffic(make_standin: Any, kind: str) -> None:
    a, url_a = make_standin(name="a", weight_version="default" if kind == "sglang" else None)
    b, url_b = make_standin(name="b", weight_version="default" if kind == "sglang" else None)
    sampler = sampler_for(kind, [url_a, url_b], health_interval_s=0.05, unhealthy_after=1)
    sid = session_on(sampler, url_a)
    server_a = sampler.pool.servers[0]

    async def go() -> None:
        await WeightPusher(sampler).push(WEIGHTS, 7)
        await sampler.sample([1], PARAMS, session_id=sid)
        a.health_status = 503  # the engine goes down...
        await wait_for(lambda: not server_a.healthy, "a to be marked unhealthy")
        a.restart()  # ...and comes back with its launch weights
        a.health_status = 200
        await wait_for(lambda: server_a.healthy and not server_a.needs_weights, "a to be readmitted")
        await sampler.sample([1], PARAMS, session_id=sid)
        await sampler.aclose()

    asyncio.run(go())
    assert a.served_with == [WEIGHTS, WEIGHTS]  # never its launch weights
    update = "/update_weights_from_disk" if kind == "sglang" else "/collective_rpc"
    paths = [h.path for h in a.hits if h.path in (update, "/generate", "/inference/v1/generate")]
    assert paths.count(update) == (2 if kind == "sglang" else 4)  # the push, then the re-push
    assert paths[-1] != update  # the re-push came before the request that followed


def test_a_server_down_during_a_push_waits_for_the_weights_instead_of_retiring(make_standin: Any) -> None:
    a, url_a = make_standin(name="a")
    b, url_b = make_standin(name="b")
    sampler = sampler_for("vllm", [url_a, url_b], health_interval_s=0.05, unhealthy_after=1)
    server_a = sampler.pool.servers[0]

    async def go() -> Any:
        a.health_status = 503
        await sampler.check_health()
        report = await WeightPusher(sampler).push(WEIGHTS, 7)
        assert server_a.needs_weights and a.weights == "launch"
        results = [await sampler.sample([1], PARAMS, session_id=f"s{i}") for i in range(6)]
        a.health_status = 200
        sampler.pool.ensure_health_checks(sampler.client())
        await wait_for(lambda: server_a.healthy and not server_a.needs_weights, "a to be readmitted")
        await sampler.aclose()
        return report, results

    report, results = asyncio.run(go())
    assert report.waiting == [url_a] and report.updated == [url_b] and not report.retired
    assert not a.generate_hits() and {r.weight_version for r in results} == {7}
    assert a.weights == WEIGHTS and server_a in sampler.pool.servers


"""Both HTTP samplers against the real local inference server: real tokens and logprobs.

Each protocol (vLLM ``/inference/v1/generate``, vLLM ``/v1/completions``,
SGLang ``/generate``) must give exactly the tokens the in-process
``LocalSampler`` gives for the same weights and per-request seed, with the
same logprobs, and must report stop/length finishes, weight versions and
cancellation the way the engines do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.samplers import HttpSamplerConfig, SGLangSampler, VLLMSampler, build_http_sampler
from core.samplers.http_sampler import HttpSampler, affinity_key
from core.types import FinishReason, SampleResult, SamplingParams
from tests.samplers.conftest import LocalServer

PROTOCOLS = {
    "vllm-generate": {"kind": "vllm", "vllm_endpoint": "generate"},
    "vllm-completions": {"kind": "vllm", "vllm_endpoint": "completions"},
    "sglang": {"kind": "sglang"},
}


def make_sampler(protocol: str, urls: list[str], **kw: Any) -> HttpSampler:
    kw.setdefault("health_interval_s", 0)
    return build_http_sampler(HttpSamplerConfig(urls=urls, **PROTOCOLS[protocol], **kw))


def prompts(backend: Any) -> list[list[int]]:
    tok = backend.get_tokenizer()
    out = []
    for n in range(4):
        enc = tok.apply_chat_template(
            [{"role": "user", "content": f"After {n}? " * (n + 1)}],
            add_generation_prompt=True,
            tokenize=True,
        )
        out.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return out


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=16, seed=11),
        SamplingParams(max_tokens=16, temperature=0.7, top_k=20, top_p=0.9, seed=12),
        SamplingParams(max_tokens=16, temperature=0.0),
    ],
    ids=["t1", "t0.7-topk-topp", "greedy"],
)
def test_tokens_and_logprobs_equal_the_local_sampler(
    local_server: LocalServer, reference: Any, protocol: str, params: SamplingParams
) -> None:
    ps = prompts(reference)

    async def go() -> tuple[list[SampleResult], list[SampleResult]]:
        sampler = make_sampler(protocol, [local_server.url])
        try:
            # Concurrent: the server batches them, as a real engine would.
            got = await asyncio.gather(
                *(sampler.sample(p, params, session_id=f"s{i}") for i, p in enumerate(ps))
            )
        finally:
            await sampler.aclose()
        want = [await reference.sampler.sample(p, params, session_id="ref") for p in ps]
        return got, want

    got, want = asyncio.run(go())
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
        assert g.finish_reason == w.finish_reason
        assert len(g.token_ids) >= 1


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_stop_and_length_finish_reasons(local_server: LocalServer, protocol: str) -> None:
    prompt = prompts(local_server.backend)[0]

    async def go() -> tuple[SampleResult, SampleResult]:
        sampler = make_sampler(protocol, [local_server.url])
        try:
            greedy = await sampler.sample(
                prompt, SamplingParams(max_tokens=6, temperature=0), session_id="s"
            )
            stop_at = greedy.token_ids[3]
            first = greedy.token_ids.index(stop_at)
            stopped = await sampler.sample(
                prompt,
                SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(stop_at,)),
                session_id="s",
            )
            assert stopped.token_ids == greedy.token_ids[: first + 1]
            return greedy, stopped
        finally:
            await sampler.aclose()

    greedy, stopped = asyncio.run(go())
    assert greedy.finish_reason is FinishReason.LENGTH and len(greedy.token_ids) == 6
    assert stopped.finish_reason is FinishReason.STOP


def test_weight_version_comes_from_sglang_and_from_config_for_vllm(
    local_server: LocalServer,
) -> None:
    prompt = prompts(local_server.backend)[0]
    params = SamplingParams(max_tokens=2)

    async def go() -> tuple[int, int, int]:
        sglang = make_sampler("sglang", [local_server.url])
        vllm = make_sampler("vllm-generate", [local_server.url], weight_version=7)
        try:
            before = (await sglang.sample(prompt, params, session_id="s")).weight_version
            local_server.bg.run(
                local_server.backend.sync_sampler()
            )  # the server's weights move to v+1
            after = (await sglang.sample(prompt, params, session_id="s")).weight_version
            return before, after, (await vllm.sample(prompt, params, session_id="s")).weight_version
        finally:
            await sglang.aclose()
            await vllm.aclose()

    before, after, vllm_version = asyncio.run(go())
    assert after == before + 1  # read from meta_info.weight_version
    assert vllm_version == 7  # vLLM does not report one: the sampler's own


@pytest.mark.parametrize("protocol", ["vllm-generate", "sglang"])
def test_cancelling_the_caller_cancels_the_request_on_the_server(
    slow_local_server: LocalServer, protocol: str
) -> None:
    """vLLM: the dropped connection is seen as a disconnect; SGLang: /abort_request by rid."""
    prompt = prompts(slow_local_server.backend)[0]
    before = slow_local_server.stats()

    async def go() -> None:
        sampler = make_sampler(protocol, [slow_local_server.url])
        try:
            task = asyncio.create_task(
                sampler.sample(prompt, SamplingParams(max_tokens=8), session_id="s")
            )
            for _ in range(200):  # until the server holds it (it waits 400 ms to batch)
                await asyncio.sleep(0.01)
                if slow_local_server.stats()["in_flight"]:
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await sampler.aclose()  # waits for the abort call to finish

    asyncio.run(go())
    for _ in range(100):
        after = slow_local_server.stats()
        if after["in_flight"] == 0:
            break
        asyncio.run(asyncio.sleep(0.02))
    # Whichever reached the server first (the closed connection or the abort call) cancelled it.
    cancelled = (
        after["aborted"] + after["disconnected"] - before["aborted"] - before["disconnected"]
    )
    assert cancelled == 1
    assert after["abort_calls"] == before["abort_calls"] + (1 if protocol == "sglang" else 0)
    assert after["in_flight"] == 0


def test_sessions_stick_to_one_of_several_real_servers(
    local_server: LocalServer, slow_local_server: LocalServer
) -> None:
    """Two real servers: each session's turns all land on its server; sessions spread over both."""
    prompt = prompts(local_server.backend)[1]
    servers = {local_server.url: local_server, slow_local_server.url: slow_local_server}
    before = {url: srv.stats()["requests"] for url, srv in servers.items()}
    sessions = [f"session-{i}" for i in range(10)]

    async def go() -> dict[str, int]:
        sampler = make_sampler("sglang", list(servers))
        home = {sid: sampler.pool.ranked(affinity_key(sid))[0].url for sid in sessions}

        async def session(sid: str) -> None:
            for _ in range(3):  # turns of one session run one after another
                await sampler.sample(prompt, SamplingParams(max_tokens=1), session_id=sid)

        try:
            await asyncio.gather(*(session(sid) for sid in sessions))
        finally:
            await sampler.aclose()
        return {url: 3 * sum(1 for sid in sessions if home[sid] == url) for url in servers}

    expected = asyncio.run(go())
    served = {url: srv.stats()["requests"] - before[url] for url, srv in servers.items()}
    assert served == expected
    assert all(n > 0 for n in served.values())


def test_exports() -> None:
    assert issubclass(VLLMSampler, HttpSampler) and issubclass(SGLangSampler, HttpSampler)

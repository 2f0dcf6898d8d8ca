"""Partial rollouts over vLLM (#28): a weight push pauses the server with ``mode=abort``,
the running generation answers its tokens so far, and the sampler continues it on the
new weights, one segment per version.

The server is a stand-in for vLLM's network edge (``tests/samplers/servers.py``; no
vLLM in CI), modelled on vLLM's RL pause API as its source and docs/training/async_rl.md
describe it: ``POST /pause?mode=abort`` ends the running requests with finish reason
``abort`` and their partial output, requests arriving while paused wait, ``POST /resume``
schedules them again. In its ``decode`` mode each token and logprob says which weights
sampled it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from core.errors import RunAborted
from core.samplers.weights import WeightPusher
from core.types import SamplingParams, Segment
from tests.samplers.servers import StandIn
from tests.samplers.test_fleet_weights import WEIGHTS, sampler_for, wait_for

PROMPT = [1, 2, 3]
LONG = SamplingParams(max_tokens=60)


@pytest.mark.parametrize("continue_aborted", [True, False])
def test_a_push_pauses_vllm_and_the_aborted_generation_goes_on_under_the_new_weights(
    make_standin: Any, continue_aborted: bool
) -> None:
    standin, url = make_standin(mode="decode", tick_s=0.01)
    sampler = sampler_for("vllm", [url], abort_on_push=True, continue_aborted=continue_aborted)

    async def go() -> Any:
        task = asyncio.create_task(sampler.sample(PROMPT, LONG, session_id="s"))
        await wait_for(lambda: standin.running == 1, "a running generation")
        await asyncio.sleep(0.1)  # some tokens under the launch weights
        report = await WeightPusher(sampler).push(WEIGHTS, 7)
        out = await task
        await sampler.aclose()
        return report, out

    report, out = asyncio.run(go())
    assert report.updated == [url] and sampler.weight_version == 7
    calls = [h.path for h in standin.hits if h.path not in ("/inference/v1/generate", "/health")]
    assert calls == ["/pause", "/collective_rpc", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert standin.pauses == ["mode=abort&clear_cache=true"]
    first = standin.generate_hits()[0].body
    assert first["cache_salt"] == "tracerl-v0"
    if not continue_aborted:
        k = len(out.token_ids)
        assert out.finish_reason.value == "abort" and 0 < k < LONG.max_tokens and not out.segments
        assert len(standin.generate_hits()) == 1
        return
    seg_old, seg_new = out.segments
    k = seg_old.end
    assert 0 < k < LONG.max_tokens
    assert (seg_old, seg_new) == (Segment(0, k, 0), Segment(k, LONG.max_tokens, 7))
    assert out.finish_reason.value == "length" and out.weight_version == 0
    # Each token is what the weights of its segment sample at its position, with their logprob.
    positions = range(len(PROMPT), len(PROMPT) + LONG.max_tokens)
    expected = [StandIn.decoded("launch" if i < k else WEIGHTS, p) for i, p in enumerate(positions)]
    assert out.token_ids == [t for t, _ in expected]
    assert out.logprobs == [lp for _, lp in expected]
    # The continuation: prompt + the tokens so far, the rest of max_tokens, sent after the
    # push (the new version's salt), served by the new weights.
    again = standin.generate_hits()[1].body
    assert again["token_ids"] == [*PROMPT, *out.token_ids[:k]]
    assert again["sampling_params"]["max_tokens"] == LONG.max_tokens - k
    assert again["cache_salt"] == "tracerl-v7"
    assert standin.served_with == ["launch", WEIGHTS]


def test_routed_experts_of_a_continued_generation_are_kept_per_part(make_standin: Any) -> None:
    """R3 across a continued generation: each part's routing, from the weights that sampled
    it, stays with that part's tokens (it was dropped before)."""
    standin, url = make_standin(mode="decode", tick_s=0.01, routed_experts="R3")
    sampler = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> Any:
        task = asyncio.create_task(sampler.sample(PROMPT, LONG, session_id="s"))
        await wait_for(lambda: standin.running == 1, "a running generation")
        await asyncio.sleep(0.1)
        await WeightPusher(sampler).push(WEIGHTS, 7)
        out = await task
        await sampler.aclose()
        return out

    out = asyncio.run(go())
    k, n = out.segments[0].end, LONG.max_tokens
    assert out.routed_experts == {
        "format": "parts",
        "parts": [
            {"start": 0, "end": k, "weight_version": 0,
             "routed_experts": {"format": "npy-base64", "data": f"R3:launch:{k}"}},
            {"start": k, "end": n, "weight_version": 7,
             "routed_experts": {"format": "npy-base64", "data": f"R3:{WEIGHTS}:{n - k}"}},
        ],
    }


def test_a_request_sent_during_the_push_waits_for_the_new_weights(make_standin: Any) -> None:
    """Not sent mid-push under the old label: it goes out after the push with the new version.

    The stand-in's reload waits for the test's gate, so the request is sent while the server
    is certainly paused, however slowly this machine runs."""
    gate = threading.Event()
    standin, url = make_standin(mode="decode", tick_s=0.01, reload_gate=gate)
    sampler = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> Any:
        try:
            running = asyncio.create_task(sampler.sample(PROMPT, LONG, session_id="a"))
            await wait_for(lambda: standin.running == 1, "a running generation")
            push = asyncio.create_task(WeightPusher(sampler).push(WEIGHTS, 7))
            await wait_for(lambda: standin.paused, "the pause")
            late = asyncio.create_task(sampler.sample(PROMPT, SamplingParams(max_tokens=4), session_id="b"))
            await asyncio.sleep(0.2)  # time to reach the server, were it not held
            assert not late.done() and standin.paused_hits == []
            gate.set()
            await push
            await running
            return await late
        finally:
            gate.set()
            await sampler.aclose()

    late = asyncio.run(go())
    assert late.weight_version == 7 and not late.segments
    assert late.token_ids == [StandIn.decoded(WEIGHTS, p)[0] for p in range(3, 7)]
    salts = [h.body["cache_salt"] for h in standin.generate_hits()]
    assert salts.count("tracerl-v7") == 2 and salts[0] == "tracerl-v0"


def test_a_generation_aborted_before_its_first_token_is_sent_again_on_the_new_weights(
    make_standin: Any,
) -> None:
    """The pause lands before the first decode step: the abort carries no token, but the
    weights changed since it was sent, so it is sent again (not a 503 to the agent)."""
    standin, url = make_standin(mode="decode", tick_s=0.5)
    sampler = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> Any:
        task = asyncio.create_task(sampler.sample(PROMPT, SamplingParams(max_tokens=2), session_id="s"))
        await wait_for(lambda: standin.running == 1, "a running generation")
        await WeightPusher(sampler).push(WEIGHTS, 7)
        out = await task
        await sampler.aclose()
        return out

    out = asyncio.run(go())
    assert out.finish_reason.value == "length" and out.weight_version == 7 and not out.segments
    assert out.token_ids == [StandIn.decoded(WEIGHTS, p)[0] for p in (3, 4)]
    assert len(standin.generate_hits()) == 2 and standin.served_with == ["launch", WEIGHTS]


def test_a_vllm_without_the_pause_api_is_refused_naming_the_setting(make_standin: Any) -> None:
    standin, url = make_standin(mode="decode", pause_api=False)
    sampler = sampler_for("vllm", [url], abort_on_push=True)

    async def go() -> None:
        try:
            await WeightPusher(sampler).push(WEIGHTS, 7)
        finally:
            await sampler.aclose()

    with pytest.raises(RunAborted, match=r"no pause API for sampler.abort_on_push.*abort_on_push=false"):
        asyncio.run(go())
    assert not [h for h in standin.hits if h.path == "/collective_rpc"]


def test_a_request_waiting_for_a_connection_at_the_hold_goes_out_after_the_push(make_standin: Any) -> None:
    """A request that passed the gate before the hold but still waited for a pooled connection
    (two connections, two running generations) is stopped before its first byte when a
    connection frees up mid-push, and sent after the push under the new version: no
    generate request reaches the paused server, and every token is labelled with the
    weights that sampled it."""
    standin, url = make_standin(mode="decode", tick_s=0.01, reload_s=0.3)
    sampler = sampler_for("vllm", [url], abort_on_push=True, max_connections=1, connections_per_shard=1)

    async def go() -> list[Any]:
        tasks = [asyncio.create_task(sampler.sample(PROMPT, LONG, session_id=f"s{i}")) for i in range(3)]
        await wait_for(lambda: standin.running == 2, "two running generations")
        await asyncio.sleep(0.1)
        assert standin.running == 2 and len(standin.generate_hits()) == 2  # the third waits for a connection
        await WeightPusher(sampler).push(WEIGHTS, 7)
        outs = await asyncio.gather(*tasks)
        await sampler.aclose()
        return outs

    outs = asyncio.run(go())
    assert standin.paused_hits == []
    for out in outs:
        for seg in out.segments or (Segment(0, len(out.token_ids), out.weight_version),):
            weights = "launch" if seg.weight_version == 0 else WEIGHTS
            positions = range(len(PROMPT) + seg.start, len(PROMPT) + seg.end)
            assert out.token_ids[seg.start : seg.end] == [StandIn.decoded(weights, p)[0] for p in positions]
    assert sorted(len(out.segments) for out in outs) == [0, 2, 2]  # two continued, one sent after
    late = next(out for out in outs if not out.segments)
    assert late.weight_version == 7
    assert [h.body["cache_salt"] for h in standin.generate_hits()].count("tracerl-v0") == 2

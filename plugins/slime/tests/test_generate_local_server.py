"""``generate()`` with the SGLang sampler over real HTTP to the local inference server.

``python -m tracerl_local.serve``'s server (the offline tiny model, real
tokens and logprobs from a real forward pass) answers SGLang's ``/generate``
here, so nothing in the sampling path is scripted. ``Sample`` is the
plugin's stand-in pinned to slime commit 624b824a898ab0ec1fcb4d373004c7f3852bf515.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import agent_overrides, compose_tracerl, slime_args
from tracerl_slime.generate import generate
from tracerl_slime.rewards import post_process_rewards
from tracerl_slime.sample import Sample

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(slime_loop: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tracerl_local.backend import LocalBackend
    from tracerl_local.config import LocalBackendConfig
    from tracerl_local.serve import InferenceServer

    backend = LocalBackend(LocalBackendConfig(), seed=0)
    server = InferenceServer(backend, model_name="tiny")
    slime_loop.run_until_complete(server.start())
    cfg = compose_tracerl(
        agent_overrides(
            tmp_path_factory.mktemp("slime_local"), "+backend.sampler.health_interval_s=0"
        )
    )
    port = int(server.url.rsplit(":", 1)[1])
    try:
        yield slime_loop, slime_args(cfg, sglang_router_port=port), server
    finally:
        slime_loop.run_until_complete(server.stop())
        slime_loop.run_until_complete(backend.aclose())


def test_real_model_rows_over_sglang_http(env: Any) -> None:
    loop, args, server = env
    samples = [
        Sample(group_index=0, index=k, metadata={"tracerl_payload": {"mode": mode, "n": k}})
        for k, mode in enumerate(["two_turn", "two_turn", "fork", "crash"])
    ]

    async def go() -> list[list[Any]]:
        sp = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64}
        return list(await asyncio.gather(*(generate(args, s, dict(sp)) for s in samples)))

    async def stats() -> dict[str, Any]:
        # the server runs in this (slime's) loop: ask it from inside the loop
        async with httpx.AsyncClient() as client:
            return (await client.get(server.url + "/tracerl/stats", timeout=10)).json()  # type: ignore[no-any-return]

    before = loop.run_until_complete(stats())
    outs = loop.run_until_complete(go())
    after = loop.run_until_complete(stats())
    assert [len(o) for o in outs] == [1, 1, 2, 1]
    assert after["requests"] - before["requests"] == 2 + 2 + 3 + 1
    for k, o in enumerate(outs[:3]):
        for s in o:
            assert s.rollout_id == k
            assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 0
            trained = [lp for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if m]
            assert trained and all(lp <= 0.0 for lp in trained)
            assert any(lp < 0.0 for lp in trained)  # real logprobs of a sampled model
            assert all(
                lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if not m
            )
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert outs[3][0].status is Sample.Status.ABORTED and outs[3][0].remove_sample
    raw, rewards = post_process_rewards(args, [s for o in outs for s in o])
    assert len(raw) == len(rewards) == 5 and rewards[-1] == 0.0

"""The real gateway sampling over HTTP from the real local inference server, driven by the openai SDK.

The trace must hold exactly what the model generated (tokens and logprobs
equal to the in-process ``LocalSampler`` for the same seed); a failing
server must give the agent a clear 503 and the trace a ``sampler_errors``
count, never crash the gateway; ``python -m core.gateway --sampler sglang``
must work from the command line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from core.gateway import Gateway, GatewayConfig, GatewayServer
from core.gateway.sampling import turn_seed
from core.samplers import HttpSamplerConfig, build_http_sampler
from core.types import SamplingParams
from tests.samplers.conftest import LocalServer
from tests.samplers.servers import BackgroundLoop


class ServedGateway:
    """A gateway in the background loop with an HTTP sampler."""

    def __init__(self, bg: BackgroundLoop, tok: Any, config: HttpSamplerConfig) -> None:
        self.bg = bg
        self.sampler = build_http_sampler(config)
        self.gw = Gateway(
            tokenizer=tok, sampler=self.sampler, config=GatewayConfig(), model_id="tiny"
        )
        self.server = GatewayServer(self.gw, host="127.0.0.1", port=0)
        bg.run(self.server.start())

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        async def run() -> Any:
            return fn(*args, **kw)

        return self.bg.run(run())

    def close(self) -> None:
        self.bg.run(self.server.stop())
        self.bg.run(self.sampler.aclose())


@pytest.fixture
def served(bg: BackgroundLoop, reference: Any) -> Iterator[Any]:
    made: list[ServedGateway] = []

    def make(**kw: Any) -> ServedGateway:
        kw.setdefault("health_interval_s", 0)
        g = ServedGateway(bg, reference.get_tokenizer(), HttpSamplerConfig(**kw))
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


@pytest.mark.parametrize(
    "protocol",
    [{"kind": "sglang"}, {"kind": "vllm"}, {"kind": "vllm", "vllm_endpoint": "completions"}],
)
def test_openai_sdk_through_gateway_records_the_servers_tokens(
    served: Any, local_server: LocalServer, reference: Any, protocol: dict[str, str]
) -> None:
    g = served(urls=[local_server.url], **protocol)
    params = SamplingParams(max_tokens=10, seed=21)
    sid = g.call(g.gw.create_session, sampling=params)
    client = openai.OpenAI(base_url=g.server.base_url, api_key=sid, max_retries=0)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "After 3?"}]
        first = client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And after 4?"},
        ]
        client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    finally:
        client.close()
    (row,) = g.call(g.gw.finish_session, sid)
    row.validate()
    assert len(row.turns) == 2

    async def replay() -> list[tuple[list[int], list[float]]]:
        out = []
        for turn, span in enumerate(row.turns):
            assert params.seed is not None
            seeded = dataclasses.replace(params, seed=turn_seed(params.seed, turn))
            r = await reference.sampler.sample(
                row.token_ids[: span.start], seeded, session_id="ref"
            )
            out.append((r.token_ids, r.logprobs))
        return out

    for span, (ids, lps) in zip(row.turns, asyncio.run(replay()), strict=True):
        assert row.token_ids[span.start : span.end] == ids
        assert row.logprobs[span.start : span.end] == pytest.approx(lps, abs=1e-5)
        assert all(row.loss_mask[span.start : span.end])


def test_a_failing_server_is_a_503_for_the_agent_and_a_count_in_the_trace(
    served: Any, make_standin: Any, reference: Any
) -> None:
    standin, url = make_standin(mode="http500")
    g = served(kind="sglang", urls=[url])
    sid = g.call(g.gw.create_session, sampling=SamplingParams(max_tokens=4))
    client = openai.OpenAI(base_url=g.server.base_url, api_key=sid, max_retries=0)
    try:
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )
        assert err.value.status_code == 503
        assert url in str(err.value) and "HTTP 500" in str(err.value)
        standin.mode = "malformed"
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )
        assert err.value.status_code == 503 and "malformed JSON" in str(err.value)
        # The gateway keeps serving: the server recovers, the same session goes on.
        standin.mode = "ok"
        tok = reference.get_tokenizer()
        standin.tokens = list(tok.encode("ok", add_special_tokens=False)) + [tok.eos_token_id]
        ok = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}]
        )
        assert ok.choices[0].message.content == "ok"
    finally:
        client.close()
    (row,) = g.call(g.gw.finish_session, sid)
    assert row.metadata["sampler_errors"] == 2 and len(row.turns) == 1


@pytest.mark.slow
def test_gateway_cli_samples_from_the_local_inference_server(local_server: LocalServer) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "core.gateway",
            "--sampler",
            "sglang",
            "--server-url",
            local_server.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        client = openai.OpenAI(
            base_url=info["base_url"], api_key=info["sessions"][0], max_retries=0
        )
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "After 1?"}], max_tokens=3
        )
        client.close()
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

"""``python -m tracerl_local.serve``: the local model over vLLM's and SGLang's token-id APIs.

Started as a user would (one command, a free port), then spoken to with
plain httpx in each protocol's own shapes, including bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracerl_local.serve", "--port", "0", "--seed", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "no output"
        info = json.loads(line)
        assert info["protocols"] == ["vllm", "sglang"] and info["model"] == "tiny"
        yield info["url"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_one_command_serves_both_protocols(server_url: str) -> None:
    with httpx.Client(base_url=server_url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
        prompt = [5, 6, 7, 8]

        vllm = c.post(
            "/inference/v1/generate",
            json={
                "token_ids": prompt,
                "sampling_params": {"max_tokens": 4, "logprobs": 1, "seed": 1},
            },
        ).json()
        choice = vllm["choices"][0]
        assert len(choice["token_ids"]) == 4 and choice["finish_reason"] == "length"
        assert [e["logprob"] < 0 for e in choice["logprobs"]["content"]] == [True] * 4

        comp = c.post(
            "/v1/completions",
            json={
                "prompt": prompt,
                "max_tokens": 4,
                "logprobs": 1,
                "seed": 1,
                "return_token_ids": True,
            },
        ).json()["choices"][0]
        assert comp["token_ids"] == choice["token_ids"] and comp["prompt_token_ids"] == prompt
        assert comp["logprobs"]["token_logprobs"] == pytest.approx(
            [e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-5
        )

        sg = c.post(
            "/generate",
            json={
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 4, "sampling_seed": 1},
            },
        ).json()
        meta = sg["meta_info"]
        assert [t for _, t, _ in meta["output_token_logprobs"]] == choice["token_ids"]
        assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "0"
        assert sg["output_ids"] == choice["token_ids"]

        # A text prompt works too (SGLang and completions accept one).
        text = c.post(
            "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        ).json()
        assert (
            text["meta_info"]["completion_tokens"] == 2
            and "output_token_logprobs" not in text["meta_info"]
        )

        # Bad input: 400 in the OpenAI envelope, naming the field.
        bad = c.post("/inference/v1/generate", json={"sampling_params": {}})
        assert bad.status_code == 400 and "token_ids" in bad.json()["error"]["message"]
        bad = c.post("/generate", json={"input_ids": [1], "sampling_params": {"top_p": 2}})
        assert bad.status_code == 400 and "top_p" in bad.json()["error"]["message"]
        bad = c.post(
            "/generate", json={"input_ids": [10**6], "sampling_params": {"max_new_tokens": 1}}
        )
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
        bad = c.post("/generate", json={"input_ids": [1], "stream": True})
        assert bad.status_code == 400 and "stream" in bad.json()["error"]["message"]
        assert c.post("/abort_request", json={"rid": "nobody"}).status_code == 200
        assert c.post("/abort_requests", json={}).status_code == 400
        stats = c.get("/tracerl/stats").json()
        assert stats["abort_calls"] == 1 and stats["in_flight"] == 0

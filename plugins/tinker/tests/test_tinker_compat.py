"""The backend's handling of Tinker-API servers that differ from Thinking Machines'.

Each difference was found against SkyRL tx (``tests/skyrl``, marker ``skyrl``);
these tests pin the fix without a server, with the fake service edge.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest
from tinker import types
from tinker.lib.public_interfaces import sampling_client
from tinker_fakes import FakeServiceClient, FakeTrainingClient, done, failed
from tracerl_tinker import backend as backend_mod
from tracerl_tinker import compat
from tracerl_tinker.backend import TinkerBackend, restore_training_client

from core.types import Datum


class Refused(Exception):
    """What the SDK raises for an HTTP error: an exception with ``status_code``."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"Error code: {status_code}")
        self.status_code = status_code


class PerModelLoadClient(FakeTrainingClient):
    """A training client that restores through the per-model ``load_weights`` request."""

    loaded: list[tuple[str, bool]] = []

    def _load_state_impl(self, path: str, optimizer: bool, weights_access_token: str | None) -> Any:
        self.loaded.append((path, optimizer))
        self.steps = self.service.states[path]
        return done(types.LoadWeightsResponse(path=path))


class SkyrlLikeService(FakeServiceClient):
    """Refuses SDK 0.38's session-scoped restore (422) and has no session-finish route (404)."""

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None) -> Any:
        self.log.creates.append({"kind": "from_state", "path": path, "base_model": base_model})
        return failed(Refused(422))

    def create_lora_training_client(self, **kwargs: Any) -> Any:
        self.log.creates.append({"kind": "lora", **kwargs})
        client = PerModelLoadClient(self)
        self.training_clients.append(client)
        return done(client)

    def close(self, status: str, detail: str | None = None) -> Any:
        self.log.closes.append(status)
        return failed(Refused(404))


def _datum() -> Datum:
    return Datum(
        model_input=[5, 6, 7, 8],
        target_tokens=[6, 7, 8, 9],
        logprobs=[0.0, 0.0, -0.5, -0.25],
        advantages=[0.0, 0.0, 1.5, 1.5],
        weights=[0.0, 0.0, 1.0, 1.0],
    )


def test_loss_is_the_sum_of_elementwise_losses_when_no_metric_says() -> None:
    outputs = [
        {"elementwise_loss": types.TensorData(data=[0.5, 1.0], dtype="float32"), "logprobs": None},
        {"elementwise_loss": types.TensorData(data=[0.25], dtype="float32")},
    ]
    assert backend_mod._with_loss({}, outputs)["loss"] == pytest.approx(1.75)
    assert backend_mod._with_loss({"loss:sum": 3.0}, outputs)["loss"] == 3.0  # a reported loss wins
    assert np.isnan(backend_mod._with_loss({}, [{"logprobs": None}])["loss"])


def test_samples_without_sequence_ids_are_accepted() -> None:
    compat.allow_missing_sequence_ids()
    compat.allow_missing_sequence_ids()  # idempotent: wrapped once
    response = types.SampleResponse(
        sequences=[
            types.SampledSequence(
                stop_reason="length",
                sequence_id="",
                tokens_np=np.asarray([1, 2], dtype=np.int32),
                logprobs_np=np.asarray([-0.5, -0.5], dtype=np.float32),
            )
        ]
    )
    out = sampling_client._attach_sequence_ids(response, None)
    assert out.sequences[0].sequence_id.startswith("tracerl-")
    kept = sampling_client._attach_sequence_ids(response, ["server-id"])
    assert kept.sequences[0].sequence_id == "server-id"


def test_a_refused_restore_falls_back_to_a_new_lora_client(tiny_tokenizer: Any) -> None:
    service = SkyrlLikeService(tiny_tokenizer)
    service.states["tinker://m/weights/step_2"] = 2
    lora = {"rank": 8, "seed": 0, "train_mlp": True, "train_attn": True, "train_unembed": True}
    training = restore_training_client(service, "tinker://m/weights/step_2", base_model="Qwen/Qwen3-8B", lora=lora)
    assert training.steps == 2
    assert PerModelLoadClient.loaded[-1] == ("tinker://m/weights/step_2", True)  # with the optimizer
    assert service.log.creates[-1] == {"kind": "lora", "base_model": "Qwen/Qwen3-8B", **lora}

    # without a base model, the checkpoint's own (and its rank) are read from the server
    class Info:
        base_model = "from/checkpoint"
        lora_rank = 4

    restore_training_client(
        service, "tinker://m/weights/step_2", base_model="", lora=lora, weights_info=lambda path: Info()
    )
    assert service.log.creates[-1]["base_model"] == "from/checkpoint" and service.log.creates[-1]["rank"] == 4


def test_other_failures_are_not_retried(tiny_tokenizer: Any) -> None:
    service = FakeServiceClient(tiny_tokenizer)  # unknown path: KeyError, not a refusal
    with pytest.raises(KeyError):
        restore_training_client(service, "tinker://nowhere", base_model="m", lora={"rank": 8})
    assert [c["kind"] for c in service.log.creates] == ["from_state"]


def test_backend_resumes_and_closes_against_such_a_server(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from omegaconf import OmegaConf
    from tracerl_tinker.config import TinkerBackendConfig

    service = SkyrlLikeService(tiny_tokenizer)
    monkeypatch.setattr(backend_mod, "make_service_client", lambda **kw: service)
    node = OmegaConf.structured(TinkerBackendConfig)
    node.base_model, node.api_key, node.tokenizer, node.lora_rank = "Qwen/Qwen3-8B", "tml-test", "tiny", 8
    backend = TinkerBackend.from_config(OmegaConf.create({"backend": node}))

    async def body() -> None:
        await backend.forward_backward([_datum()], "cross_entropy")
        await backend.optim_step(backend_mod.AdamParams(learning_rate=1e-3))
        path = await backend.save_state("/run/checkpoints/step_000001/backend")
        await backend.load_state(path)
        assert backend.weight_version == 1
        assert service.training_clients[-1].steps == 1
        with caplog.at_level(logging.INFO, logger="tracerl_tinker.backend"):
            await backend.aclose()

    asyncio.run(body())
    assert service.log.closes == ["success"]
    assert "no session-finish route" in caplog.text
    assert "closing the Tinker session failed" not in caplog.text

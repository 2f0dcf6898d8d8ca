"""The Tinker backend against the real tinker SDK types, with fakes only at the network edge.

Tinker has no offline mode, so ``make_service_client`` (the one function that
reaches the service) is replaced by ``tinker_fakes.FakeServiceClient``, which
returns tinker's real futures and result types. The tests check what the
plugin sends: tinker ``Datum``s with the right tokens, dtypes, shapes, shifted
targets and masks, sampling params, Adam params, and the session close.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf
from tinker import types
from tinker_fakes import FakeServiceClient
from tracerl_tinker import backend as backend_mod
from tracerl_tinker.backend import TinkerBackend
from tracerl_tinker.config import TinkerBackendConfig
from tracerl_tinker.sampler import tinker_stop

from core.errors import ConfigError, SamplerError, TrainingError
from core.interfaces import Sampler, TrainingBackend
from core.testing.conformance import BackendConformance, MultiPolicyConformance, datum_from_sample
from core.types import AdamParams, Datum, FinishReason, SamplingParams


def _cfg(**overrides: Any) -> Any:
    node = OmegaConf.structured(TinkerBackendConfig)
    node.base_model = "Qwen/Qwen3-8B"
    node.api_key = "tml-test"
    node.tokenizer = "tiny"
    for key, value in overrides.items():
        setattr(node, key, value)
    return OmegaConf.create({"backend": node})


@pytest.fixture
def service(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> FakeServiceClient:
    fake = FakeServiceClient(tiny_tokenizer)
    monkeypatch.setattr(backend_mod, "make_service_client", lambda **kw: fake)
    return fake


@pytest.fixture
def backend(service: FakeServiceClient) -> TinkerBackend:
    return TinkerBackend.from_config(_cfg())


def _datum() -> Datum:
    # row: prompt [5, 6, 7], generated [8, 9]; shifted by one
    return Datum(
        model_input=[5, 6, 7, 8],
        target_tokens=[6, 7, 8, 9],
        logprobs=[0.0, 0.0, -0.5, -0.25],
        advantages=[0.0, 0.0, 1.5, 1.5],
        weights=[0.0, 0.0, 1.0, 1.0],
    )


class TestTinkerConformance(BackendConformance):
    """The shared backend contract, over the fake Tinker service."""

    logprob_atol = 1e-6  # the fake trainer echoes the sampler logprobs it was sent

    @pytest.fixture
    def backend(self, service: FakeServiceClient) -> TinkerBackend:
        return TinkerBackend.from_config(_cfg())


class TestTinkerMultiPolicyConformance(MultiPolicyConformance):
    """``backend=tinker`` declares ``multi_policy``: a backend per policy, each with its own LoRA
    training and sampling client in the same (fake) service."""

    compares_samples = False  # the fake samples seeded noise per call, not from its weights

    @pytest.fixture
    def backends(self, service: FakeServiceClient) -> tuple[TinkerBackend, TinkerBackend]:
        return TinkerBackend.from_config(_cfg()), TinkerBackend.from_config(_cfg())


def test_satisfies_protocols_and_start_up_calls(
    backend: TinkerBackend, service: FakeServiceClient
) -> None:
    assert isinstance(backend, TrainingBackend)
    assert isinstance(backend.sampler, Sampler)
    assert backend.weight_version == 0
    assert backend.model_id() == "Qwen/Qwen3-8B"
    create = service.log.creates[0]
    assert create == {
        "kind": "lora",
        "base_model": "Qwen/Qwen3-8B",
        "rank": 32,
        "seed": None,
        "train_mlp": True,
        "train_attn": True,
        "train_unembed": True,
    }
    assert len(service.sampling_clients) == 1  # initial sampler over the fresh adapter
    asyncio.run(backend.aclose())
    asyncio.run(backend.aclose())  # idempotent
    assert service.log.closes == ["success"]


def test_rl_datum_is_tinker_shaped(backend: TinkerBackend, service: FakeServiceClient) -> None:
    async def body() -> None:
        await backend.forward_backward([_datum()], "ppo", {"clip_low": 0.2, "clip_high": 0.28, "temperature": 1.0})
        await backend.aclose()

    asyncio.run(body())
    data, loss_fn, config = service.log.forward_backward[0]
    assert loss_fn == "ppo"
    assert config == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    (sent,) = data
    assert isinstance(sent, types.Datum)
    assert sent.model_input.to_ints() == [5, 6, 7, 8]
    inputs = sent.loss_fn_inputs
    # Tinker's RL losses take no weights: the mask lives in the advantages.
    assert set(inputs) == {"target_tokens", "logprobs", "advantages"}
    targets = inputs["target_tokens"]
    assert targets.dtype == "int64" and targets.shape == [4]
    assert targets.to_numpy().dtype == np.int64
    assert targets.to_numpy().tolist() == [6, 7, 8, 9]  # model_input shifted by one
    assert inputs["logprobs"].dtype == "float32"
    assert inputs["logprobs"].to_numpy().tolist() == pytest.approx([0.0, 0.0, -0.5, -0.25])
    assert inputs["advantages"].to_numpy().tolist() == pytest.approx([0.0, 0.0, 1.5, 1.5])


def test_mask_is_folded_into_advantages(backend: TinkerBackend, service: FakeServiceClient) -> None:
    datum = Datum(
        model_input=[1, 2, 3],
        target_tokens=[2, 3, 4],
        logprobs=[0.0, -1.0, -1.0],
        advantages=[2.0, 2.0, 2.0],  # a careless caller: advantage outside the mask
        weights=[0.0, 1.0, 0.5],
    )
    asyncio.run(backend.forward_backward([datum], "importance_sampling"))
    sent = service.log.forward_backward[0][0][0]
    assert sent.loss_fn_inputs["advantages"].to_numpy().tolist() == pytest.approx([0.0, 2.0, 1.0])
    assert service.log.forward_backward[0][2] is None  # no loss config sent when none given
    asyncio.run(backend.aclose())


def test_cross_entropy_sends_weights(backend: TinkerBackend, service: FakeServiceClient) -> None:
    result = asyncio.run(backend.forward_backward([_datum(), _datum()], "cross_entropy"))
    data, loss_fn, config = service.log.forward_backward[0]
    assert loss_fn == "cross_entropy" and config is None and len(data) == 2
    inputs = data[0].loss_fn_inputs
    assert set(inputs) == {"target_tokens", "weights"}
    assert inputs["weights"].dtype == "float32"
    assert inputs["weights"].to_numpy().tolist() == [0.0, 0.0, 1.0, 1.0]
    assert result.metrics["loss"] == result.metrics["loss:sum"] == pytest.approx(4.0)
    assert [len(lp) for lp in result.logprobs] == [4, 4]
    asyncio.run(backend.aclose())


def test_optim_step_passes_core_adam_settings(
    backend: TinkerBackend, service: FakeServiceClient
) -> None:
    params = AdamParams(learning_rate=3e-4, beta1=0.8, beta2=0.99, eps=1e-7, weight_decay=0.1, grad_clip_norm=1.0)
    metrics = asyncio.run(backend.optim_step(params))
    sent = service.log.optim_steps[0]
    assert isinstance(sent, types.AdamParams)
    assert sent.model_dump() == {
        "learning_rate": 3e-4,
        "beta1": 0.8,
        "beta2": 0.99,
        "eps": 1e-7,
        "weight_decay": 0.1,
        "grad_clip_norm": 1.0,
    }
    assert metrics == {"step": 1.0}
    asyncio.run(backend.aclose())


def test_sampling_params_and_stop_tokens(backend: TinkerBackend, service: FakeServiceClient) -> None:
    eos = backend.get_tokenizer().eos_token_id
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=20, seed=3, stop_token_ids=(42,))
    out = asyncio.run(backend.sampler.sample([1, 2, 3], params, session_id="s"))
    prompt, n, sent = service.log.samples[0]
    assert prompt.to_ints() == [1, 2, 3] and n == 1
    assert (sent.max_tokens, sent.temperature, sent.top_p, sent.top_k, sent.seed) == (5, 0.7, 0.9, 20, 3)
    assert sent.stop == [42, eos]  # a list replaces Tinker's implicit EOS stop, so EOS is re-added
    assert 1 <= len(out.token_ids) <= 5 and len(out.logprobs) == len(out.token_ids)
    assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    asyncio.run(backend.aclose())


def test_stop_strings_and_ids_become_text(tiny_tokenizer: Any) -> None:
    assert tinker_stop(SamplingParams(), tiny_tokenizer) is None
    both = tinker_stop(SamplingParams(stop=("\n\n",), stop_token_ids=()), tiny_tokenizer)
    assert both == ["\n\n", "<|im_end|>"]
    with pytest.raises(SamplerError, match="mix stop strings"):
        tinker_stop(SamplingParams(stop=("x",), stop_token_ids=(3,)), None)


def test_in_flight_request_finishes_on_old_client(
    backend: TinkerBackend, service: FakeServiceClient
) -> None:
    async def body() -> None:
        old = service.sampling_clients[-1]
        old.hold = True
        task = asyncio.create_task(
            backend.sampler.sample([1, 2], SamplingParams(max_tokens=3), session_id="a")
        )
        while not old.pending:
            await asyncio.sleep(0.001)
        await backend.sync_sampler()
        assert backend.weight_version == 1
        new = service.sampling_clients[-1]
        assert new is not old
        fresh = await backend.sampler.sample([1, 2], SamplingParams(max_tokens=3), session_id="b")
        assert fresh.weight_version == 1
        old.release()
        stale = await task
        assert stale.weight_version == 0  # it ran, and is reported, on the old weights
        await backend.aclose()

    asyncio.run(body())
    assert len(service.log.samples) == 2


def test_save_and_resume_from_config(backend: TinkerBackend, service: FakeServiceClient) -> None:
    """The weight version survives a resume (it restarted at 1, so a resumed run's turns and
    traces reused the versions of other weights). The service is the Tinker SDK's stand-in
    at the network edge (``tinker_fakes.py``)."""

    async def body() -> str:
        for _ in range(3):
            await backend.forward_backward([_datum()], "ppo")
            await backend.optim_step(AdamParams())
            await backend.sync_sampler()
        path = await backend.save_state("/runs/x/checkpoints/step 3")
        await backend.aclose()
        return path

    path = asyncio.run(body())
    assert path == "tinker://run-1/weights/checkpoints_step_3-v3"
    resumed = TinkerBackend.from_config(_cfg(resume_from=path))
    assert service.log.creates[-1] == {"kind": "from_state", "path": path, "base_model": "Qwen/Qwen3-8B"}
    assert service.training_clients[-1].steps == 3
    assert resumed.weight_version == 3

    async def sample_and_load() -> tuple[int, int]:
        first = await resumed.sampler.sample([1, 2], SamplingParams(max_tokens=2), session_id="s")
        fresh = TinkerBackend.from_config(_cfg())
        await fresh.load_state(path)  # what the loop's resume calls
        version = fresh.weight_version
        await fresh.aclose()
        await resumed.aclose()
        return first.weight_version, version

    assert asyncio.run(sample_and_load()) == (3, 3)


def test_a_checkpoint_named_by_another_tool_resumes_at_the_next_version(
    backend: TinkerBackend, service: FakeServiceClient
) -> None:
    service.states["tinker://run-1/weights/theirs"] = 2

    async def body() -> int:
        await backend.load_state("tinker://run-1/weights/theirs")
        version = backend.weight_version
        await backend.aclose()
        return version

    assert asyncio.run(body()) == 1


def test_load_state_rejects_foreign_paths(backend: TinkerBackend) -> None:
    with pytest.raises(ConfigError, match="tinker://"):
        asyncio.run(backend.load_state("/tmp/state"))
    asyncio.run(backend.aclose())


def test_service_error_is_training_error_and_close_says_errored(
    backend: TinkerBackend, service: FakeServiceClient
) -> None:
    service.training_clients[-1].fail_next_forward_backward = RuntimeError("quota exceeded")

    async def body() -> None:
        try:
            with pytest.raises(TrainingError, match="tinker forward_backward failed: RuntimeError: quota"):
                await backend.forward_backward([_datum()], "ppo")
        finally:
            await backend.aclose()

    asyncio.run(body())
    assert service.log.closes == ["errored"]


def test_unknown_loss_sends_nothing(backend: TinkerBackend, service: FakeServiceClient) -> None:
    with pytest.raises(ConfigError, match="dro"):
        asyncio.run(backend.forward_backward([_datum()], "dro"))  # type: ignore[arg-type]
    assert service.log.forward_backward == []
    asyncio.run(backend.aclose())


def test_datum_from_a_real_sample_round_trips(backend: TinkerBackend, service: FakeServiceClient) -> None:
    async def body() -> None:
        sample = await backend.sampler.sample([7, 8, 9], SamplingParams(max_tokens=4), session_id="r")
        await backend.forward_backward([datum_from_sample([7, 8, 9], sample)], "cispo")
        await backend.aclose()
        sent = service.log.forward_backward[0][0][0]
        full = [7, 8, 9, *sample.token_ids]
        assert sent.model_input.to_ints() == full[:-1]
        assert sent.loss_fn_inputs["target_tokens"].to_numpy().tolist() == full[1:]
        lp = sent.loss_fn_inputs["logprobs"].to_numpy()
        assert lp[2:].tolist() == pytest.approx(sample.logprobs, abs=1e-6)

    asyncio.run(body())


@pytest.mark.parametrize(
    ("overrides", "env", "named"),
    [
        ({"base_model": ""}, {"TINKER_API_KEY": "tml-x"}, ["backend.base_model"]),
        ({"api_key": ""}, {}, ["backend.api_key", "TINKER_API_KEY"]),
        ({"base_model": "", "api_key": ""}, {}, ["backend.base_model", "backend.api_key"]),
    ],
)
def test_missing_config_fails_fast_without_remote_calls(
    overrides: dict[str, Any], env: dict[str, str], named: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    called: list[Any] = []
    monkeypatch.setattr(backend_mod, "make_service_client", lambda **kw: called.append(kw))
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        TinkerBackend.from_config(_cfg(**overrides))
    assert time.monotonic() - start < 1.0
    assert called == []
    for name in named:
        assert name in str(info.value)
    assert "Nothing was sent" in str(info.value)


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-from-env")
    seen: dict[str, Any] = {}
    fake = FakeServiceClient(tiny_tokenizer)

    def make(**kw: Any) -> FakeServiceClient:
        seen.update(kw)
        return fake

    monkeypatch.setattr(backend_mod, "make_service_client", make)
    backend = TinkerBackend.from_config(_cfg(api_key=""))
    assert seen["api_key"] == "tml-from-env"
    asyncio.run(backend.aclose())


def test_real_service_client_is_lazy() -> None:
    """The real SDK client is built without any network call (it connects on first use)."""
    start = time.monotonic()
    client = backend_mod.make_service_client(api_key="tml-offline", base_url="http://127.0.0.1:9")
    assert time.monotonic() - start < 1.0
    assert type(client).__name__ == "ServiceClient"
    assert os.environ.get("TINKER_API_KEY") != "tml-offline"


def _full_cfg(**algorithm: Any) -> Any:
    """Backend and algorithm nodes, as ``core.train`` hands them to the factory."""
    from core.trainer.config import AlgorithmConfig

    cfg = _cfg()
    cfg.algorithm = OmegaConf.structured(AlgorithmConfig)
    for key, value in algorithm.items():
        OmegaConf.update(cfg, f"algorithm.{key}", value)
    return cfg


@pytest.mark.parametrize("loss", ["ppo", "cispo", "importance_sampling"])
def test_training_temperature_is_refused_before_any_remote_call(
    loss: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tinker cannot temper its trainer logprobs: refuse instead of a mismatched ratio."""
    called: list[Any] = []
    monkeypatch.setattr(backend_mod, "make_service_client", lambda **kw: called.append(kw))
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        TinkerBackend.from_config(_full_cfg(temperature=0.7, loss=loss))
    assert time.monotonic() - start < 1.0
    assert called == []
    assert "algorithm.temperature=0.7" in str(info.value)
    assert "Nothing was sent" in str(info.value)


def test_temperature_one_and_supervised_loss_start(service: FakeServiceClient) -> None:
    asyncio.run(TinkerBackend.from_config(_full_cfg()).aclose())
    asyncio.run(TinkerBackend.from_config(_full_cfg(temperature=0.7, loss="cross_entropy")).aclose())


def test_forward_backward_refuses_a_temperature_and_sends_nothing(
    backend: TinkerBackend, service: FakeServiceClient
) -> None:
    with pytest.raises(ConfigError, match="temperature"):
        asyncio.run(backend.forward_backward([_datum()], "ppo", {"temperature": 0.5}))
    with pytest.raises(ConfigError, match="entropy_coef"):
        asyncio.run(backend.forward_backward([_datum()], "ppo", {"entropy_coef": 0.01}))
    assert service.log.forward_backward == []
    asyncio.run(backend.aclose())


@pytest.mark.parametrize(
    ("loss_config", "expected"),
    [
        ({"temperature": 1.0}, {"clip_low_threshold": 0.0, "clip_high_threshold": 1.2}),
        ({"clip_high": 0.28}, {"clip_low_threshold": 0.0, "clip_high_threshold": 1.28}),
        ({"clip_low": 0.2, "clip_high": 0.2}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    ],
)
def test_cispo_sends_both_bounds_with_core_defaults(
    backend: TinkerBackend, service: FakeServiceClient, loss_config: dict[str, float], expected: dict[str, float]
) -> None:
    """Not Tinker's own CISPO default (upper bound 4.0): the local backend's, explicitly."""
    asyncio.run(backend.forward_backward([_datum()], "cispo", loss_config))
    assert service.log.forward_backward[0][2] == pytest.approx(expected)
    asyncio.run(backend.aclose())


def test_parity_batch_reaches_the_wire_unchanged(backend: TinkerBackend, service: FakeServiceClient) -> None:
    """core.testing.parity through core's own datum step, then Tinker's datum translation:
    each trained row's advantages reach the wire as the specification says (shifted by one,
    masked), and no row of a failed rollout is sent."""
    from core.testing.parity import expected_token_advantages, parity_batch
    from core.trainer.signal import build_signal

    batch = parity_batch()
    signal = build_signal(batch)  # the loop's own rollouts -> datums step, core's defaults
    datums = signal.datums
    expected = expected_token_advantages(batch)
    assert signal.sources == list(expected)  # one datum per trained row, in batch order
    masks = {(r.request.rollout_id, row.row_index): row.loss_mask for r in batch for row in r.rows}
    asyncio.run(backend.forward_backward(datums, "ppo", {"clip_low": 0.2, "clip_high": 0.2}))
    sent = service.log.forward_backward[0][0]
    assert len(sent) == len(expected)  # failed rollouts send nothing
    for wire, key in zip(sent, expected, strict=True):  # dicts keep the batch order
        adv = wire.loss_fn_inputs["advantages"].to_numpy().tolist()
        assert adv == pytest.approx(expected[key][1:], abs=1e-6), key
        # the mask is folded in: nothing outside the shifted loss mask
        assert all(a == 0.0 for a, m in zip(adv, masks[key][1:], strict=True) if not m), key
    asyncio.run(backend.aclose())

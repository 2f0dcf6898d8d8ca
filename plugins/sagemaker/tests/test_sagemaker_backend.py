"""The SageMaker backend driving the real SDK clients through a fake runtime.

``make_service_client`` (the one function that reaches AWS) is replaced by
``sagemaker_fakes.FakeControlPlane``, which builds the SDK's real
``TrainingClient`` on ``FakeRuntime``, a stand-in for the runtime service at
the network edge. So the SDK's own validation (every loss needs ``weights``,
per-token lengths, stop strings only) and serialisation run, and the tests read
the exact wire dicts the service would receive.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from omegaconf import OmegaConf
from sagemaker_fakes import GROUP, FakeControlPlane
from tracerl_sagemaker import backend as backend_mod
from tracerl_sagemaker.backend import SageMakerBackend, package_arn, saved_version
from tracerl_sagemaker.config import SageMakerBackendConfig
from tracerl_sagemaker.sampler import sagemaker_sampling_params

from core.errors import ConfigError, SamplerError, TrainingError
from core.interfaces import Sampler, TrainingBackend
from core.testing.conformance import BackendConformance
from core.types import AdamParams, Datum, FinishReason, SamplingParams

ROLE = "arn:aws:iam::123456789012:role/SageMakerTrainingSessions"
MODEL = "huggingface-llm-qwen3-8b"


def _cfg(**overrides: Any) -> Any:
    node = OmegaConf.structured(SageMakerBackendConfig)
    node.role_arn = ROLE
    node.region = "us-west-2"
    node.base_model = MODEL
    node.model_package_group_arn = GROUP
    node.s3_output_path = "s3://bucket/out"
    node.tokenizer = "tiny"
    for key, value in overrides.items():
        setattr(node, key, value)
    return OmegaConf.create({"backend": node})


@pytest.fixture
def aws(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    fake = FakeControlPlane(tiny_tokenizer)
    monkeypatch.setattr(backend_mod, "make_service_client", lambda resolved: fake)
    return fake


@pytest.fixture
def backend(aws: FakeControlPlane) -> SageMakerBackend:
    return SageMakerBackend.from_config(_cfg())


def _datum() -> Datum:
    return Datum(
        model_input=[5, 6, 7, 8],
        target_tokens=[6, 7, 8, 9],
        logprobs=[0.0, 0.0, -0.5, -0.25],
        advantages=[0.0, 0.0, 1.5, 1.5],
        weights=[0.0, 0.0, 1.0, 1.0],
    )


class TestSageMakerConformance(BackendConformance):
    """The shared backend contract, through the real SDK clients on a fake runtime."""

    logprob_atol = None  # SageMaker returns no per-token trainer logprobs

    @pytest.fixture
    def backend(self, aws: FakeControlPlane) -> SageMakerBackend:
        return SageMakerBackend.from_config(_cfg())


def test_start_up_and_stop(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    assert isinstance(backend, TrainingBackend)
    assert isinstance(backend.sampler, Sampler)
    assert aws.creates == [
        {
            "kind": "lora",
            "base_model": MODEL,
            "rank": 32,
            "alpha": 64,
            "model_package_group_arn": GROUP,
            "s3_output_path": "s3://bucket/out",
        }
    ]
    name = backend.session_name
    asyncio.run(backend.aclose())
    assert aws.stops == [name]
    asyncio.run(backend.aclose())  # idempotent
    assert aws.stops == [name]


def test_every_loss_sends_weights_on_the_wire(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    async def body() -> None:
        ppo = await backend.forward_backward([_datum()], "ppo", {"clip_low": 0.2, "clip_high": 0.28, "temperature": 1.0})
        ce = await backend.forward_backward([_datum()], "cross_entropy")
        await backend.aclose()
        assert ppo.metrics["loss"] == ppo.metrics["actor/pg_loss"] == pytest.approx(3.0)
        assert ppo.logprobs == [] and ce.metrics["loss"] == pytest.approx(2.0)

    asyncio.run(body())
    (k1, fb, meta), (k2, ce, _) = aws.runtime.log.training
    assert (k1, k2) == ("forwardBackward", "forwardBackward")
    assert meta["sequenceNumber"] == 1 and meta["clientToken"]
    assert fb["lossFnName"] == "ppo"
    assert fb["lossFnConfig"] == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    (wire,) = fb["datumList"]
    assert wire["modelInput"] == {"chunks": [{"tokens": [5, 6, 7, 8], "type": "encoded_text"}]}
    inputs = wire["lossFnInputs"]
    assert set(inputs) == {"target_tokens", "weights", "logprobs", "advantages"}
    assert inputs["target_tokens"] == {"data": [6, 7, 8, 9], "dtype": "int64", "shape": [4]}
    assert inputs["weights"] == {"data": [0.0, 0.0, 1.0, 1.0], "dtype": "float32", "shape": [4]}
    assert inputs["logprobs"]["data"] == [0.0, 0.0, -0.5, -0.25]
    assert inputs["advantages"]["data"] == [0.0, 0.0, 1.5, 1.5]
    assert ce["lossFnName"] == "cross_entropy" and "lossFnConfig" not in ce
    assert set(ce["datumList"][0]["lossFnInputs"]) == {"target_tokens", "weights"}


def test_optim_step_sends_core_values_not_sdk_defaults(
    backend: SageMakerBackend, aws: FakeControlPlane
) -> None:
    metrics = asyncio.run(backend.optim_step(AdamParams(learning_rate=2e-4, beta2=0.95, grad_clip_norm=0.0)))
    asyncio.run(backend.aclose())
    kind, body, _ = aws.runtime.log.training[0]
    assert kind == "optimizerStep"
    assert body["adamParamsConfig"] == {
        "learningRate": 2e-4,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
        "weightDecay": 0.0,  # SDK default would be 0.01
    }  # grad_clip_norm 0 (off) is sent as absent, not as a clip to 0
    assert metrics == {"actor/lr": 2e-4}


def test_small_max_tokens_and_stop_ids(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    eos = backend.get_tokenizer().eos_token_id
    vocab = aws.runtime.vocab
    params = SamplingParams(max_tokens=8, temperature=0.5, stop=("###",), stop_token_ids=(vocab[0],))
    out = asyncio.run(backend.sampler.sample([1, 2, 3], params, session_id="s"))
    asyncio.run(backend.aclose())
    kind, body = aws.runtime.log.sampling[-1]
    assert kind == "sample" and body["numSamples"] == 1
    assert body["prompt"]["chunks"][0]["tokens"] == [1, 2, 3]
    sp = body["samplingParams"]
    assert sp["maxTokens"] == 512  # the service minimum; cut to 8 on our side
    assert sp["temperature"] == 0.5 and sp["topP"] == 1.0 and "topK" not in sp
    assert sp["stop"] == ["###", backend.get_tokenizer().decode([vocab[0]])]
    assert "modelPackageArn" not in body  # base model before the first sync
    assert 1 <= len(out.token_ids) <= 8
    if vocab[0] in out.token_ids:
        assert out.token_ids[-1] == vocab[0] and out.finish_reason is FinishReason.STOP
    elif len(out.token_ids) == 8:
        assert out.finish_reason is FinishReason.LENGTH
    else:
        assert out.token_ids[-1] == eos and out.finish_reason is FinishReason.STOP


def test_sdk_refuses_token_id_stops_so_we_send_text(tiny_tokenizer: Any) -> None:
    sp = sagemaker_sampling_params(SamplingParams(stop_token_ids=(7,)), tiny_tokenizer, min_max_tokens=512)
    assert sp.stop == [tiny_tokenizer.decode([7])]
    with pytest.raises(SamplerError, match="stop strings only"):
        sagemaker_sampling_params(SamplingParams(stop_token_ids=(7,)), None, min_max_tokens=512)


def test_rebind_in_flight_request_keeps_old_package(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    async def body() -> None:
        aws.runtime.hold_sampling = True
        task = asyncio.create_task(backend.sampler.sample([1, 2], SamplingParams(max_tokens=3), session_id="a"))
        while not aws.runtime.held:
            await asyncio.sleep(0.001)
        aws.runtime.hold_sampling = False
        await backend.sync_sampler()
        assert backend.weight_version == 1
        fresh = await backend.sampler.sample([1, 2], SamplingParams(max_tokens=3), session_id="b")
        aws.runtime.release()
        stale = await task
        assert (stale.weight_version, fresh.weight_version) == (0, 1)
        await backend.aclose()

    asyncio.run(body())
    samples = [b for k, b in aws.runtime.log.sampling if k == "sample"]
    assert "modelPackageArn" not in samples[0]  # the in-flight one: base weights
    assert samples[1]["modelPackageArn"] == aws.runtime.sampling_package
    kinds = [k for k, _ in aws.runtime.log.sampling]
    assert kinds == ["sample", "loadWeightsForSampling", "sample"]
    assert aws.runtime.log.training_kinds() == ["saveWeights"]


def test_checkpoint_resume_from_config(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    async def body() -> str:
        await backend.forward_backward([_datum()], "importance_sampling")
        await backend.optim_step(AdamParams())
        arn = await backend.save_state("/runs/x/step_1")
        await backend.aclose()
        return arn

    checkpoint = asyncio.run(body())
    # The optim_step is not served yet: these weights would be served as version 1.
    assert ":model-package/tracerl-test/" in checkpoint and checkpoint.endswith("-v1")
    arn = package_arn(checkpoint)
    assert arn + "-v1" == checkpoint and saved_version(checkpoint) == 1
    save = [b for k, b, _ in aws.runtime.log.training if k == "saveState"][0]
    assert save == {"description": "tracerl checkpoint /runs/x/step_1"}
    aws.runtime.steps = 0  # a fresh session
    resumed = SageMakerBackend.from_config(_cfg(resume_from=checkpoint))
    assert aws.creates[-1]["kind"] == "from_state" and aws.creates[-1]["arn"] == arn
    assert aws.runtime.steps == 1
    assert resumed.weight_version == 1  # the version it saved, not a restart at 0
    load = [b for k, b, _ in aws.runtime.log.training if k == "loadState"][-1]
    assert load == {"modelPackageArn": arn, "loadOptimizer": True}
    # the first sampler serves the restored weights, not the base model
    assert aws.runtime.log.sampling[-1] == ("loadWeightsForSampling", {"modelPackageArn": aws.runtime.sampling_package})
    asyncio.run(resumed.aclose())


def test_load_state_serves_the_saved_version_and_a_bare_arn_the_next_one(
    backend: SageMakerBackend, aws: FakeControlPlane
) -> None:
    """A resume must not label other weights with a version the run used before (#28)."""

    async def body() -> tuple[str, int, int]:
        for _ in range(3):
            await backend.forward_backward([_datum()], "importance_sampling")
            await backend.optim_step(AdamParams())
            await backend.sync_sampler()
        checkpoint = await backend.save_state("/runs/x/step_3")
        fresh = SageMakerBackend.from_config(_cfg())
        await fresh.load_state(checkpoint)  # what the loop's resume calls
        restored = fresh.weight_version
        await fresh.load_state(package_arn(checkpoint))  # saved by another tool: no version
        bare = fresh.weight_version
        await fresh.aclose()
        await backend.aclose()
        return checkpoint, restored, bare

    checkpoint, restored, bare = asyncio.run(body())
    assert checkpoint.endswith("-v3") and restored == 3 and bare == 4
    loads = [b["modelPackageArn"] for k, b, _ in aws.runtime.log.training if k == "loadState"]
    assert loads == [package_arn(checkpoint)] * 2  # AWS gets the ARN alone


def test_operation_failure_is_training_error_and_session_still_stops(
    backend: SageMakerBackend, aws: FakeControlPlane
) -> None:
    aws.runtime.fail_next["forwardBackward"] = "CUDA out of memory"

    async def body() -> None:
        try:
            with pytest.raises(TrainingError, match="sagemaker forward_backward failed.*CUDA out of memory"):
                await backend.forward_backward([_datum()], "ppo")
        finally:
            await backend.aclose()

    asyncio.run(body())
    assert aws.stops == [backend.session_name]
    with pytest.raises(TrainingError, match="stopped"):
        asyncio.run(backend.optim_step(AdamParams()))


def test_failed_start_after_session_creation_stops_it(
    aws: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sagemaker.train.training_session import TrainingClient

    def broken(self: Any, *a: Any, **k: Any) -> Any:
        raise RuntimeError("sampling endpoint unavailable")

    monkeypatch.setattr(TrainingClient, "create_sampling_client", broken)
    with pytest.raises(TrainingError, match="was stopped.*sampling endpoint unavailable"):
        SageMakerBackend.from_config(_cfg())
    assert aws.stops == ["tracerl-0001"]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"role_arn": ""}, ["backend.role_arn"]),
        ({"base_model": ""}, ["backend.base_model"]),
        ({"region": ""}, ["backend.region", "AWS_REGION"]),
        ({"role_arn": "", "base_model": "", "region": ""}, ["backend.role_arn", "backend.base_model", "backend.region"]),
    ],
)
def test_missing_config_fails_fast_without_aws_calls(
    overrides: dict[str, Any], named: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    called: list[Any] = []
    monkeypatch.setattr(backend_mod, "make_service_client", lambda resolved: called.append(resolved))
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        SageMakerBackend.from_config(_cfg(**overrides))
    assert time.monotonic() - start < 1.0
    assert called == []
    for name in named:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"role_arn": "SageMakerRole"}, "IAM role ARN"),
        ({"resume_from": "s3://bucket/ckpt"}, "model package ARN"),
        ({"s3_output_path": "bucket/out"}, "s3://"),
    ],
)
def test_malformed_values_are_named(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SageMakerBackend.from_config(_cfg(**overrides))


def test_region_from_environment(aws: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    resolved = backend_mod.validate_config(_cfg(region="").backend)
    assert resolved["region"] == "eu-central-1"


def test_missing_sagemaker_core_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sagemaker.core", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install --no-deps 'sagemaker-train"):
        backend_mod.make_service_client(backend_mod.validate_config(_cfg().backend))


def _full_cfg(**algorithm: Any) -> Any:
    """Backend and algorithm nodes, as ``core.train`` hands them to the factory."""
    from core.trainer.config import AlgorithmConfig

    cfg = _cfg()
    cfg.algorithm = OmegaConf.structured(AlgorithmConfig)
    for key, value in algorithm.items():
        OmegaConf.update(cfg, f"algorithm.{key}", value)
    return cfg


def test_training_temperature_reaches_every_datum(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    """SageMaker takes ``temperature`` as a loss input: at 0.7 every RL datum carries it,
    so the service can temper its logprobs as the sampler did; at 1.0 and for
    cross_entropy nothing extra is sent."""

    async def body() -> None:
        await backend.forward_backward([_datum(), _datum()], "ppo", {"temperature": 0.7})
        await backend.forward_backward([_datum()], "ppo", {"temperature": 1.0})
        await backend.forward_backward([_datum()], "cross_entropy", {"temperature": 0.7})
        await backend.aclose()

    asyncio.run(body())
    (_, tempered, _), (_, plain, _), (_, ce, _) = aws.runtime.log.training
    for wire in tempered["datumList"]:
        assert wire["lossFnInputs"]["temperature"] == {"data": [0.7], "dtype": "float32", "shape": [1]}
    assert "temperature" not in tempered["lossFnConfig"]  # the service rejects unknown config keys
    assert "temperature" not in plain["datumList"][0]["lossFnInputs"]
    assert "temperature" not in ce["datumList"][0]["lossFnInputs"]


@pytest.mark.parametrize(
    ("algorithm", "named"),
    [
        ({"loss_config": {"clip_low": 0.2, "clip_high": 9.5}}, "clip_high_threshold"),
        ({"loss_config": {"clip_low": 0.2, "entropy_coef": 0.01}}, "entropy_coef"),
        ({"loss_config": {"clip_low": 0.2, "kl_coef": 0.1}}, "kl_coef"),
        ({"temperature": 0.0}, "> 0"),
    ],
)
def test_unsupported_loss_settings_fail_before_aws(
    algorithm: dict[str, Any], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[Any] = []
    monkeypatch.setattr(backend_mod, "make_service_client", lambda resolved: called.append(resolved))
    start = time.monotonic()
    with pytest.raises(ConfigError, match=named):
        SageMakerBackend.from_config(_full_cfg(**algorithm))
    assert time.monotonic() - start < 1.0
    assert called == []


def test_a_tempered_config_starts(aws: FakeControlPlane) -> None:
    backend = SageMakerBackend.from_config(_full_cfg(temperature=0.7, loss="cispo"))
    asyncio.run(backend.aclose())


def test_cispo_sends_both_bounds_with_core_defaults(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    asyncio.run(backend.forward_backward([_datum()], "cispo", {"clip_high": 0.28}))
    asyncio.run(backend.aclose())
    fb = aws.runtime.log.training[0][1]
    assert fb["lossFnConfig"] == pytest.approx({"clip_low_threshold": 0.0, "clip_high_threshold": 1.28})


def test_parity_batch_reaches_the_wire_unchanged(backend: SageMakerBackend, aws: FakeControlPlane) -> None:
    """core.testing.parity through core's own datum step, then the SDK's serialisation:
    advantages and weights of each trained row reach the wire as specified (shifted
    by one), and no row of a failed rollout is sent."""
    from core.testing.parity import expected_token_advantages, parity_batch
    from core.trainer.signal import build_signal

    batch = parity_batch()
    signal = build_signal(batch)  # the loop's own rollouts -> datums step, core's defaults
    datums = signal.datums
    expected = expected_token_advantages(batch)
    assert signal.sources == list(expected)  # one datum per trained row, in batch order
    masks = {(r.request.rollout_id, row.row_index): row.loss_mask for r in batch for row in r.rows}
    asyncio.run(backend.forward_backward(datums, "ppo", {"clip_low": 0.2, "clip_high": 0.2}))
    asyncio.run(backend.aclose())
    wire = aws.runtime.log.training[0][1]["datumList"]
    assert len(wire) == len(expected)
    for sent, key in zip(wire, expected, strict=True):
        inputs = sent["lossFnInputs"]
        assert inputs["advantages"]["data"] == pytest.approx(expected[key][1:], abs=1e-6), key
        assert inputs["weights"]["data"] == [float(m) for m in masks[key][1:]], key

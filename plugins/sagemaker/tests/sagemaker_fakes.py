"""Stand-ins for AWS, at the network edge we cannot reach in tests.

``FakeRuntime`` stands in for the ``sagemakertrainingsessionruntime`` boto3
client (``ExecuteTrainingOperation`` / ``GetTrainingOperationResult`` /
``ExecuteSamplingOperation`` / ``GetSamplingOperationResult``): it receives the
wire dicts the *real* SDK ``TrainingClient`` and ``SamplingClient`` build,
after the SDK's own validation and serialisation, and answers in the service's
wire shape. ``FakeControlPlane`` stands in for the SDK's ``ServiceClient``
(CreateTrainingSession / StopTrainingSession through sagemaker-core); it builds
real ``TrainingClient`` objects on the fake runtime.

The "model" is a counter of optimizer steps, so saved state is observable.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sagemaker.train.training_session import TrainingClient

REGION = "us-west-2"
ACCOUNT = "123456789012"
GROUP = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package-group/tracerl-test"


@dataclass
class RuntimeLog:
    """Every wire call, in order: (operation kind, operationConfig body, extra fields)."""

    training: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    sampling: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def training_kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.training]


class FakeRuntime:
    """Stands in for the training-session runtime service (the network edge)."""

    def __init__(self, vocab: list[int], eos: int, cycle_first: bool = False) -> None:
        self.vocab = vocab
        self.cycle_first = cycle_first
        self._sample_calls = itertools.count()
        self.eos = eos
        self.log = RuntimeLog()
        self.steps = 0
        self.packages: dict[str, int] = {}
        self.sampling_package = ""  # what loadWeightsForSampling pointed the sampler at
        self.fail_next: dict[str, str] = {}  # operation kind -> errorDetails
        self.hold_sampling = False
        self.held: list[str] = []
        self._results: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._versions = itertools.count(1)
        self._lock = threading.Lock()

    # -- training ----------------------------------------------------------

    def execute_training_operation(
        self, *, trainingSessionName: str, sequenceNumber: int, clientToken: str, operationConfig: dict[str, Any]
    ) -> dict[str, Any]:
        ((kind, body),) = operationConfig.items()
        with self._lock:
            self.log.training.append(
                (kind, body, {"sequenceNumber": sequenceNumber, "clientToken": clientToken, "session": trainingSessionName})
            )
            op_id = f"op-{next(self._ids)}"
            self._results[op_id] = self._train(kind, body)
        return {"operationId": op_id}

    def get_training_operation_result(self, *, trainingSessionName: str, operationId: str) -> dict[str, Any]:
        return self._results[operationId]

    def _train(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if kind in self.fail_next:
            return {"status": "Failed", "errorDetails": self.fail_next.pop(kind)}
        if kind == "forwardBackward":
            scale = 1.0 / (1.0 + self.steps)
            loss = 0.0
            for datum in body["datumList"]:
                inputs = datum["lossFnInputs"]
                weight = inputs["weights"]["data"]
                if "advantages" in inputs:
                    weight = [w * abs(a) for w, a in zip(weight, inputs["advantages"]["data"], strict=True)]
                loss += sum(weight) * scale
            result = {"metrics": {"actor/pg_loss": loss, "global_token_num": 1.0}, "lossFnOutputs": [{"actor/pg_loss": loss}]}
        elif kind == "optimizerStep":
            self.steps += 1
            result = {"metrics": {"actor/lr": body["adamParamsConfig"]["learningRate"]}}
        elif kind in ("saveState", "saveWeights"):
            arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/tracerl-test/{next(self._versions)}"
            self.packages[arn] = self.steps
            result = {"modelPackageArn": arn}
        elif kind == "loadState":
            self.steps = self.packages[body["modelPackageArn"]]
            result = {}
        else:
            return {"status": "Failed", "errorDetails": f"unknown operation {kind}"}
        return {"status": "Completed", "operationResult": {kind: result}}

    # -- sampling ------------------------------------------------------------

    def execute_sampling_operation(self, *, trainingSessionName: str, operationConfig: dict[str, Any]) -> dict[str, Any]:
        ((kind, body),) = operationConfig.items()
        with self._lock:
            self.log.sampling.append((kind, body))
            op_id = f"sop-{next(self._ids)}"
            if kind == "loadWeightsForSampling":
                self.sampling_package = body["modelPackageArn"]
                self._results[op_id] = {"status": "Completed", "operationResult": {kind: {}}}
            elif kind == "sample":
                self._results[op_id] = self._sample(body)
                if self.hold_sampling:
                    self.held.append(op_id)
            else:
                self._results[op_id] = {"status": "Failed", "errorDetails": f"unsupported {kind}"}
        return {"operationId": op_id}

    def get_sampling_operation_result(self, *, trainingSessionName: str, operationId: str) -> dict[str, Any]:
        with self._lock:
            if operationId in self.held:
                return {"status": "InProgress"}
            return self._results[operationId]

    def release(self) -> None:
        with self._lock:
            self.held.clear()

    def _sample(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = [t for chunk in body["prompt"]["chunks"] for t in chunk["tokens"]]
        params = body["samplingParams"]
        steps = self.packages.get(body.get("modelPackageArn", ""), 0)
        call = next(self._ids)  # each call differs, so a GRPO group is not constant
        digest = hashlib.sha256(f"{prompt}|{steps}|{params.get('seed')}|{call}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        sequences = []
        for _ in range(body["numSamples"]):
            tokens: list[int] = []
            reason = "length"
            first = next(self._sample_calls)
            for _ in range(params["maxTokens"]):
                if not tokens and self.cycle_first:  # successive samples start with each entry in turn
                    token = self.vocab[first % len(self.vocab)]
                else:
                    token = int(rng.choice(self.vocab + [self.eos] if len(tokens) >= 3 else self.vocab))
                tokens.append(token)
                if token == self.eos:
                    reason = "stop"
                    break
            logprobs = [-float(x) for x in rng.uniform(0.05, 3.0, size=len(tokens))]
            sequences.append({"stopReason": reason, "tokens": tokens, "logprobs": logprobs})
        return {"status": "Completed", "operationResult": {"sample": {"sequences": sequences}}}


class FakeControlPlane:
    """Stands in for the SDK's ``ServiceClient`` (CreateTrainingSession/StopTrainingSession over AWS)."""

    def __init__(self, tokenizer: Any, vocab: list[int] | None = None, cycle_first: bool = False) -> None:
        self.tokenizer = tokenizer
        self.eos = int(tokenizer.eos_token_id)
        vocab = vocab or [i for i in range(len(tokenizer)) if i != self.eos][10:60]
        self.runtime = FakeRuntime(vocab, self.eos, cycle_first)
        self.creates: list[dict[str, Any]] = []
        self.stops: list[str] = []
        self.fail_create: Exception | None = None
        self._names = itertools.count(1)

    def _new_client(self, base_model: str) -> TrainingClient:
        return TrainingClient(
            f"tracerl-{next(self._names):04d}",
            self.runtime,
            base_model=base_model,
            tokenizer=self.tokenizer,
            model_package_group_arn=GROUP,
            service_client=self,
        )

    def create_lora_training_client(self, base_model: str, **kwargs: Any) -> TrainingClient:
        self.creates.append({"kind": "lora", "base_model": base_model, **kwargs})
        if self.fail_create is not None:
            raise self.fail_create
        return self._new_client(base_model)

    def create_training_client_from_state_with_optimizer(self, model_package_arn: str, **kwargs: Any) -> TrainingClient:
        self.creates.append({"kind": "from_state", "arn": model_package_arn, **kwargs})
        tc = self._new_client(kwargs.get("base_model", ""))
        tc.load_state_with_optimizer(model_package_arn).result()
        return tc

    def stop_session(self, training_session: str) -> None:
        self.stops.append(training_session)

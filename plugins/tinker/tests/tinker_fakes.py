"""Stand-ins for the Tinker service, at the network edge we cannot reach in tests.

Tinker has no offline mode: every ``ServiceClient.create_*`` call goes to the
service. These duck-typed ``ServiceClient`` / ``TrainingClient`` /
``SamplingClient`` fakes replace only that edge. Everything they hand back is
a real tinker type: ``AwaitableConcurrentFuture`` and the SDK's own
``Backcompat*ClientFuture`` wrappers, ``SampleResponse``, ``SampledSequence``,
``ForwardBackwardOutput``, ``OptimStepResponse``, ``SaveWeightsResponse``.
They record every request so tests can check what the plugin sent.

The "model" is a counter of optimizer steps: losses and logprobs depend on it,
so a saved-and-loaded state is observable.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture
from tinker.lib.public_interfaces.backcompat_sampling_client_future import (
    BackcompatSamplingClientFuture,
)
from tinker.lib.public_interfaces.backcompat_training_client_future import (
    BackcompatTrainingClientFuture,
)


def done(value: Any) -> AwaitableConcurrentFuture[Any]:
    """A completed tinker future (the service answered)."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_result(value)
    return AwaitableConcurrentFuture(fut)


def failed(exc: BaseException) -> AwaitableConcurrentFuture[Any]:
    """A tinker future that resolves to an error (the service refused)."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_exception(exc)
    return AwaitableConcurrentFuture(fut)


@dataclass
class ServiceLog:
    """Everything the plugin asked the fake service, in order."""

    creates: list[dict[str, Any]] = field(default_factory=list)
    forward_backward: list[tuple[list[types.Datum], str, Any]] = field(default_factory=list)
    optim_steps: list[types.AdamParams] = field(default_factory=list)
    samples: list[tuple[types.ModelInput, int, types.SamplingParams]] = field(default_factory=list)
    saves: list[str] = field(default_factory=list)
    closes: list[str] = field(default_factory=list)


class FakeSamplingClient:
    """Stands in for ``tinker.SamplingClient`` (the network edge): seeded fake decoding.

    ``hold`` makes ``sample`` return pending futures that the test releases,
    to check what happens to requests in flight during a weight swap.
    """

    def __init__(
        self, steps: int, log: ServiceLog, vocab: list[int], eos: int, cycle_first: bool = False
    ) -> None:
        self.steps = steps
        self.cycle_first = cycle_first
        self.log = log
        self.vocab = vocab
        self.eos = eos
        self.hold = False
        self.sampled = 0
        """Requests this client answered (a policy's turns go to its own clients only)."""
        self.trainer: FakeTrainingClient | None = None
        """The training client whose weights this client samples."""
        self.pending: list[tuple[concurrent.futures.Future[Any], types.SampleResponse]] = []
        self._ids = itertools.count()
        self._calls = itertools.count()

    def sample(
        self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams
    ) -> AwaitableConcurrentFuture[types.SampleResponse]:
        assert isinstance(prompt, types.ModelInput), type(prompt)
        assert isinstance(sampling_params, types.SamplingParams), type(sampling_params)
        self.log.samples.append((prompt, num_samples, sampling_params))
        self.sampled += 1
        response = types.SampleResponse(
            sequences=[self._decode(prompt.to_ints(), sampling_params) for _ in range(num_samples)]
        )
        if not self.hold:
            return done(response)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.pending.append((fut, response))
        return AwaitableConcurrentFuture(fut)

    def release(self) -> None:
        """Answer every held request."""
        for fut, response in self.pending:
            fut.set_result(response)
        self.pending.clear()

    def _decode(self, prompt: list[int], params: types.SamplingParams) -> types.SampledSequence:
        call = next(self._calls)  # each call differs, so a GRPO group is not constant
        digest = hashlib.sha256(f"{prompt}|{self.steps}|{params.seed}|{call}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        stops = {self.eos} if params.stop is None else {s for s in params.stop if isinstance(s, int)}
        budget = params.max_tokens or 16
        tokens: list[int] = []
        reason: types.StopReason = "length"
        for _ in range(budget):
            if not tokens and self.cycle_first:  # successive calls start with every vocab entry in turn
                token = self.vocab[call % len(self.vocab)]
            elif len(tokens) >= 2:
                token = int(rng.choice(self.vocab + [self.eos]))
            else:
                token = int(rng.choice(self.vocab))
            tokens.append(token)
            if token in stops:
                reason = "stop"
                break
        logprobs = -rng.uniform(0.05, 3.0, size=len(tokens)).astype(np.float32)
        return types.SampledSequence(
            stop_reason=reason,
            sequence_id=f"seq-{next(self._ids)}",
            tokens_np=np.asarray(tokens, dtype=np.int32),
            logprobs_np=logprobs,
        )


class FakeTrainingClient:
    """Stands in for ``tinker.TrainingClient`` (the network edge)."""

    def __init__(self, service: FakeServiceClient, steps: int = 0) -> None:
        self.service = service
        self.steps = steps
        self.fail_next_forward_backward: BaseException | None = None

    def forward_backward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: Any = None
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        assert all(isinstance(d, types.Datum) for d in data)
        self.service.log.forward_backward.append((list(data), loss_fn, loss_fn_config))
        if self.fail_next_forward_backward is not None:
            exc, self.fail_next_forward_backward = self.fail_next_forward_backward, None
            return failed(exc)
        outputs = []
        loss = 0.0
        scale = 1.0 / (1.0 + self.steps)
        for datum in data:
            n = datum.model_input.length
            inputs = datum.loss_fn_inputs
            if "logprobs" in inputs:  # RL loss: the trainer agrees with the sampler
                trainer = inputs["logprobs"].to_numpy().astype(np.float32)
                weight = np.abs(inputs["advantages"].to_numpy())
            else:
                trainer = np.full(n, -1.0 - 0.1 * self.steps, dtype=np.float32)
                weight = inputs["weights"].to_numpy()
            loss += float(np.sum(weight) * scale)
            outputs.append({"logprobs": types.TensorData(data=trainer, dtype="float32")})
        return done(
            types.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord",
                loss_fn_outputs=outputs,
                metrics={"loss:sum": loss},
            )
        )

    def optim_step(self, adam: types.AdamParams) -> AwaitableConcurrentFuture[types.OptimStepResponse]:
        assert isinstance(adam, types.AdamParams)
        self.service.log.optim_steps.append(adam)
        self.steps += 1
        return done(types.OptimStepResponse(metrics={"step": float(self.steps)}))

    def save_weights_and_get_sampling_client(self) -> BackcompatSamplingClientFuture:
        client = FakeSamplingClient(
            self.steps, self.service.log, self.service.vocab, self.service.eos, self.service.cycle_first
        )
        client.trainer = self
        self.service.sampling_clients.append(client)
        return BackcompatSamplingClientFuture(done(client))

    def save_state(
        self, name: str, ttl_seconds: int | None = None
    ) -> AwaitableConcurrentFuture[types.SaveWeightsResponse]:
        path = f"tinker://run-{self.service.run}/weights/{name}"
        self.service.states[path] = self.steps
        self.service.log.saves.append(path)
        return done(types.SaveWeightsResponse(path=path))

    def get_tokenizer(self) -> Any:
        return self.service.tokenizer


class FakeServiceClient:
    """Stands in for ``tinker.ServiceClient`` (the network edge)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        run: str = "1",
        vocab: list[int] | None = None,
        cycle_first: bool = False,
    ) -> None:
        self.cycle_first = cycle_first
        self.tokenizer = tokenizer
        self.run = run
        self.log = ServiceLog()
        self.states: dict[str, int] = {}
        self.training_clients: list[FakeTrainingClient] = []
        self.sampling_clients: list[FakeSamplingClient] = []
        self.eos = int(tokenizer.eos_token_id)
        # ordinary printable ids, so decoded text stays readable
        self.vocab = vocab or [i for i in range(len(tokenizer)) if i != self.eos][10:60]
        self._lock = threading.Lock()

    def create_lora_training_client(self, **kwargs: Any) -> BackcompatTrainingClientFuture:
        self.log.creates.append({"kind": "lora", **kwargs})
        client = FakeTrainingClient(self)
        self.training_clients.append(client)
        return BackcompatTrainingClientFuture(done(client))

    def create_training_client_from_state_with_optimizer(
        self, path: str, base_model: str | None = None
    ) -> BackcompatTrainingClientFuture:
        self.log.creates.append({"kind": "from_state", "path": path, "base_model": base_model})
        if path not in self.states:
            return BackcompatTrainingClientFuture(failed(KeyError(f"no checkpoint at {path}")))
        client = FakeTrainingClient(self, steps=self.states[path])
        self.training_clients.append(client)
        return BackcompatTrainingClientFuture(done(client))

    def close(self, status: str, detail: str | None = None) -> AwaitableConcurrentFuture[None]:
        self.log.closes.append(status)
        return done(None)

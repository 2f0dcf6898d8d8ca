"""The seams between components, as ``typing.Protocol`` classes.

Defines:

- ``Tokenizer``: the slice of a Hugging Face tokenizer the gateway and trainer use.
- ``Sampler``: token ids in; token ids, logprobs, finish reason, weight version out.
- ``TrainingBackend``: Tinker-shaped training primitives for backends we drive
  (local torch, Tinker, SageMaker). The core loop in ``core.trainer`` calls them.
- ``DrivingBackend``: a backend whose own trainer owns the loop (verl, slime);
  core only hands it the composed config.
- ``RolloutRuntime``: runs agent sessions and returns their results.

Protocols rather than base classes: a third-party backend need not import or
subclass anything from core to satisfy them; ``core.testing`` checks behaviour.
All methods that take time are ``async``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from core.types import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    RolloutRequest,
    RolloutResult,
    SampleResult,
    SamplingParams,
)

__all__ = [
    "LOSS_NAMES",
    "DrivingBackend",
    "LossName",
    "RolloutRuntime",
    "Sampler",
    "Tokenizer",
    "TrainingBackend",
]

LossName: TypeAlias = Literal["cross_entropy", "importance_sampling", "ppo", "cispo"]
"""Losses every driven backend understands (Tinker's names)."""

LOSS_NAMES: tuple[str, ...] = ("cross_entropy", "importance_sampling", "ppo", "cispo")


@runtime_checkable
class Tokenizer(Protocol):
    """What tracerl uses of a Hugging Face tokenizer (``PreTrainedTokenizerBase``)."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class Sampler(Protocol):
    """Generates tokens from the policy being trained.

    Implementations must be safe to call concurrently from many sessions; they
    should batch concurrent calls rather than serve them one by one.
    """

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str,
    ) -> SampleResult:
        """Continue ``prompt_token_ids``.

        Args:
            prompt_token_ids: The full context, exactly as the model should read it.
            params: Sampling settings for this call.
            session_id: The gateway session, for servers with session affinity.

        Returns:
            The generated tokens with their logprobs (from the distribution
            actually sampled, i.e. after temperature), the finish reason and
            the version of the weights that produced them; a generation a weight
            update interrupted and continued on the new weights reports the
            version it started on and ``segments`` (each token's version).

        Raises:
            SamplerError: the backend failed; the gateway answers 5xx/503.
        """
        ...


@runtime_checkable
class TrainingBackend(Protocol):
    """Training primitives for a backend that core drives (shaped like Tinker's API).

    Contract: ``forward_backward`` accumulates gradients, ``optim_step``
    applies and clears them, ``sync_sampler`` makes ``sampler`` serve the new
    weights and bumps the weight version. Requests already in flight on the
    old sampler finish on the old weights, or are interrupted and continued on
    the new ones with their tokens kept (the result's ``segments`` say which
    tokens each version sampled; the local backend's default).

    Optional: ``async def export_weights(path: str) -> str`` writes the current
    weights into directory ``path`` in Hugging Face layout (``config.json`` +
    safetensors) for vLLM/SGLang servers to load; a backend with it can train
    with ``sampler=vllm|sglang`` (``core.trainer.fleet``), one without is refused.
    Optional: ``async def forward(datums, loss_fn, loss_config) -> ForwardBackwardResult``
    returns the trainer's logprobs as ``forward_backward`` computes them, without a
    gradient (Tinker's ``forward``); with it the fleet's logprob probe
    (``core.trainer.probe``) checks that the servers report the trainer's logprobs.

    Optional: ``async def export_model(path: str, *, adapter: bool = False) -> str``
    writes a Hugging Face model directory (weights, LoRA merged unless ``adapter``,
    tokenizer with chat template, ``generation_config.json``) that ``transformers``,
    vLLM and SGLang load; ``python -m core.export`` calls it after ``load_state`` and
    refuses a backend without it.
    """

    name: str
    """Registered backend name, e.g. ``"local"``."""

    @property
    def sampler(self) -> Sampler:
        """The sampler serving the current weights."""
        ...

    @property
    def weight_version(self) -> int:
        """Version of the weights ``sampler`` serves; starts at 0."""
        ...

    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer whose chat template and vocabulary the model uses."""
        ...

    def model_id(self) -> str:
        """Model name agents pass in their requests (informational)."""
        ...

    async def forward_backward(
        self,
        datums: Sequence[Datum],
        loss_fn: LossName,
        loss_config: dict[str, float] | None = None,
    ) -> ForwardBackwardResult:
        """Compute the loss on ``datums`` and accumulate gradients.

        Args:
            datums: Training examples (see ``core.types.Datum``).
            loss_fn: One of ``LOSS_NAMES``.
            loss_config: Loss settings, e.g. ``{"clip_low": 0.2, "clip_high": 0.2}``.

        Raises:
            ConfigError: unknown ``loss_fn`` or bad ``loss_config``.
            TrainingError: the backend failed.
        """
        ...

    async def optim_step(self, params: AdamParams) -> dict[str, float]:
        """Apply the accumulated gradients, clear them, return metrics (e.g. ``grad_norm``)."""
        ...

    async def sync_sampler(self) -> Sampler:
        """Serve the current trained weights from the sampler; returns the new sampler."""
        ...

    async def save_state(self, path: str) -> str:
        """Save weights and optimizer state under ``path``; returns where it went."""
        ...

    async def load_state(self, path: str) -> None:
        """Restore weights and optimizer state saved by ``save_state``."""
        ...

    async def aclose(self) -> None:
        """Release resources (remote sessions bill until closed); idempotent."""
        ...


@runtime_checkable
class DrivingBackend(Protocol):
    """A backend that owns the training loop (verl, slime): core hands over the config."""

    name: str

    def run(self, cfg: Any) -> int:
        """Launch training with the composed config; return a process exit code."""
        ...


@runtime_checkable
class RolloutRuntime(Protocol):
    """Runs isolated agent sessions and collects their rewards."""

    async def start(self) -> None:
        """Bring the runtime up (start agent processes, check reachability)."""
        ...

    async def run_rollout(self, request: RolloutRequest) -> RolloutResult:
        """Run one rollout to completion or until ``request.timeout_s``.

        Never raises for agent faults: a crash, hang, missing or non-numeric
        reward comes back as a ``RolloutResult`` with a failed status.
        """
        ...

    async def cancel(self, rollout_id: str) -> None:
        """Stop a rollout in flight; its ``run_rollout`` returns a failed result."""
        ...

    async def aclose(self) -> None:
        """Stop every session and release resources; idempotent."""
        ...

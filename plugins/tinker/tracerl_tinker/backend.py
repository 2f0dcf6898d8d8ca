"""``TinkerBackend``: core's training primitives over the Tinker SDK (0.38 API).

Every Tinker call returns a future; they are awaited with ``await_result``
(the ``*_async`` forms are deprecated in 0.38). The Tinker-specific choices:

- Datums are built with tinker's own ``Datum``/``ModelInput``/``TensorData``.
  ``cross_entropy`` gets ``target_tokens`` + ``weights``; the RL losses get
  ``target_tokens`` + ``logprobs`` + ``advantages`` and **no** ``weights``
  (Tinker's RL losses take none), so the loss mask is folded into the
  advantages. SageMaker differs: every loss there requires ``weights``.
- ``forward_backward`` takes no temperature, so an RL loss at
  ``algorithm.temperature != 1`` is refused with a ``ConfigError`` at start-up
  (``check_algorithm``) rather than trained on a mismatched ratio.
  ``ppo``/``cispo`` always get both ratio bounds (core's defaults filled in).
- ``forward_backward`` returns per-token trainer ``logprobs`` per datum, so
  ``ForwardBackwardResult.logprobs`` is filled (SageMaker's is not).
- ``save_state`` names a checkpoint and returns its ``tinker://`` path; that path
  is what ``load_state`` and ``backend.resume_from`` take. Loading builds a new
  training client with ``create_training_client_from_state_with_optimizer``
  (``TrainingClient.load_state*`` are deprecated in 0.38).
- Servers other than Thinking Machines' speak the same API with differences
  the SDK does not absorb (found against SkyRL tx, see ``compat``): no loss
  metric (the loss is then the sum of each datum's ``elementwise_loss``), no
  sequence ids on samples, no session-scoped ``load_weights`` (restoring then
  falls back to a new LoRA client plus a per-model load), no session-finish
  route (closing then only releases the client).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from core.algo.losses import (
    check_algorithm,
    check_loss_fn,
    loss_inputs,
    masked_advantages,
    remote_loss,
)
from core.config_nodes import cfg_get
from core.errors import ConfigError, TrainingError
from core.interfaces import LossName
from core.remote_sdk import SamplerSlot, await_result, call_blocking, missing_keys_error
from core.types import AdamParams, Datum, ForwardBackwardResult
from tracerl_tinker import compat
from tracerl_tinker.sampler import TinkerSampler

logger = logging.getLogger(__name__)

DOCS = "docs/backends/tinker.md"
RL_KEYS = ("target_tokens", "logprobs", "advantages")
CE_KEYS = ("target_tokens", "weights")
FORWARDS_TEMPERATURE = False
"""Tinker's ``forward_backward`` takes no temperature (0.38: ``loss_fn_config`` documents
only the clip thresholds, the RL losses' inputs are ``target_tokens``, ``logprobs`` and
``advantages``), so ``algorithm.temperature != 1`` with an RL loss is refused."""
LOSS_METRIC_KEYS = ("loss", "loss:sum", "loss:mean")


def validate_config(node: Any) -> dict[str, Any]:
    """Check ``backend.*`` for Tinker without touching the network; return resolved values.

    Raises:
        ConfigError: naming every missing key (``base_model``, the API key...).
    """
    api_key = str(cfg_get(node, "api_key", "") or os.environ.get("TINKER_API_KEY", ""))
    base_model = str(cfg_get(node, "base_model", "") or "")
    resume_from = str(cfg_get(node, "resume_from", "") or "")
    missing: dict[str, str] = {}
    if not base_model and not resume_from:
        missing["backend.base_model"] = (
            "the model to fine-tune, e.g. backend.base_model=Qwen/Qwen3-8B "
            "(or backend.resume_from=tinker://... to continue a run)"
        )
    if not api_key:
        missing["backend.api_key"] = "set the TINKER_API_KEY environment variable (or backend.api_key)"
    if missing:
        raise missing_keys_error("tinker", missing, docs=DOCS)
    if resume_from and not resume_from.startswith("tinker://"):
        raise ConfigError(
            f"backend.resume_from must be a tinker:// path returned by save_state, got {resume_from!r}"
        )
    rank = int(cfg_get(node, "lora_rank", 32))
    if rank < 1:
        raise ConfigError(f"backend.lora_rank must be >= 1, got {rank!r}")
    return {
        "api_key": api_key,
        "base_url": str(cfg_get(node, "base_url", "") or os.environ.get("TINKER_BASE_URL", "")),
        "base_model": base_model,
        "resume_from": resume_from,
        "rank": rank,
    }


def make_service_client(*, api_key: str, base_url: str) -> Any:
    """The Tinker ``ServiceClient`` (lazy: it contacts the service on first use).

    The one place the plugin reaches the network; tests replace it.
    """
    import tinker

    compat.allow_missing_sequence_ids()
    return tinker.ServiceClient(api_key=api_key, base_url=base_url or None)


def weights_info_reader(*, api_key: str, base_url: str) -> Callable[[str], Any]:
    """``path -> WeightsInfoResponse`` (base model, LoRA rank) through a ``tinker.RestClient``."""

    def read(path: str) -> Any:
        import tinker

        rest = tinker.RestClient(api_key=api_key, base_url=base_url or None)
        return rest.get_weights_info_by_tinker_path(path).result()

    return read


def tinker_datum(datum: Datum, loss_fn: str) -> Any:
    """A ``tinker.types.Datum`` for ``loss_fn`` (see the module docstring for the keys)."""
    from tinker import types

    if loss_fn == "cross_entropy":
        arrays = loss_inputs(datum, CE_KEYS)
    else:
        arrays = loss_inputs(datum, RL_KEYS, overrides={"advantages": masked_advantages(datum)})
    return types.Datum(
        model_input=types.ModelInput.from_ints([int(t) for t in datum.model_input]),
        loss_fn_inputs={
            key: types.TensorData(data=a.data, dtype=a.dtype, shape=a.shape)  # type: ignore[arg-type]
            for key, a in arrays.items()
        },
    )


def _checkpoint_name(path: str, version: int) -> str:
    """Tinker names checkpoints; derive a unique, safe name from the trainer's path and
    the weight version it holds.

    The loop saves to ``.../checkpoints/step_000010/backend``, so the components from the
    step directory on are kept (``step_000010_backend``): a name reused within a run
    would collide with the earlier checkpoint. With several policies each policy's backend
    saves to ``.../step_000010/backend/<policy>``, so its name carries the policy too
    (``step_000010_backend_coder``). A path with no ``step_*`` component keeps its last
    two. The name ends in ``-v<version>`` (``saved_version`` reads it back), so a resumed
    run serves the version it saved instead of starting again at 1.
    """
    suffix = f"-v{version}"
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    steps = [i for i, p in enumerate(parts) if re.fullmatch(r"step_\d+", p)]
    kept = parts[steps[-1] :] if steps else parts[-2:]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "_".join(kept or ["state"]))[-(100 - len(suffix)) :] + suffix


def saved_version(path: str) -> int | None:
    """The weight version a ``tinker://`` checkpoint saved by ``save_state`` holds (its name's
    ``-v<N>``); None for a checkpoint named otherwise (saved by another tool)."""
    found = re.search(r"-v(\d+)$", path.rstrip("/"))
    return int(found.group(1)) if found else None


def _with_loss(metrics: dict[str, Any] | None, outputs: Any = None) -> dict[str, float]:
    out = {str(k): float(v) for k, v in (metrics or {}).items()}
    if "loss" not in out:
        for key in LOSS_METRIC_KEYS:
            if key in out:
                out["loss"] = out[key]
                break
        else:
            summed = compat.loss_from_outputs(outputs)
            out["loss"] = math.nan if summed is None else summed
    return out


def restore_training_client(
    service: Any,
    path: str,
    *,
    base_model: str,
    lora: dict[str, Any],
    weights_info: Callable[[str], Any] | None = None,
) -> Any:
    """A training client with the weights and optimizer state saved at ``path`` (blocking).

    ``create_training_client_from_state_with_optimizer`` first; a server that
    refuses its request (SkyRL tx 0.4.0: 422, no ``model_id``) gets what older
    SDKs sent instead: a new LoRA client (``base_model`` and rank from the
    checkpoint's weights info when not configured) and a per-model
    ``load_weights`` with the optimizer.
    """
    try:
        return service.create_training_client_from_state_with_optimizer(
            path, base_model=base_model or None
        ).result()
    except Exception as exc:
        if not compat.is_refusal(exc):
            raise
        logger.info(
            "the Tinker server refused create_training_client_from_state_with_optimizer (%s); "
            "restoring %s into a new LoRA client instead", exc, path,
        )
    kwargs = dict(lora)
    if not base_model:
        if weights_info is None:
            raise ConfigError(
                f"cannot restore {path}: the server refused create_training_client_from_state_with_optimizer "
                "and no backend.base_model was given to create the LoRA client with"
            )
        info = weights_info(path)
        base_model = str(info.base_model)
        kwargs["rank"] = int(info.lora_rank or kwargs["rank"])
    training = service.create_lora_training_client(base_model=base_model, **kwargs).result()
    load = getattr(training, "_load_state_impl", None)
    if load is not None:  # the request load_state_with_optimizer sends, without its deprecation log
        load(path, optimizer=True, weights_access_token=None).result()
    else:  # pragma: no cover - SDKs without the private helper
        training.load_state_with_optimizer(path).result()
    return training


class TinkerBackend:
    """``core.interfaces.TrainingBackend`` over one Tinker training client."""

    name = "tinker"

    def __init__(
        self,
        *,
        service: Any,
        training_client: Any,
        sampling_client: Any,
        tokenizer: Any,
        model_id: str,
        timeout_s: float,
        checkpoint_ttl_seconds: int | None = None,
        base_model: str = "",
        lora: dict[str, Any] | None = None,
        weights_info: Callable[[str], Any] | None = None,
        weight_version: int = 0,
    ) -> None:
        self._service = service
        self._training = training_client
        self._slot: SamplerSlot[Any] = SamplerSlot(sampling_client, weight_version)
        self._tokenizer = tokenizer
        self._model_id = model_id
        self._timeout_s = timeout_s
        self._ttl = checkpoint_ttl_seconds
        self._base_model = base_model
        self._lora = dict(lora or {"rank": 32})
        self._weights_info = weights_info
        self._sampler = TinkerSampler(self._slot, tokenizer=tokenizer, timeout_s=timeout_s)
        self._failed = False
        self._closed = False
        self._stepped = False
        """An ``optim_step`` since the weights were last served: a checkpoint now holds the next version."""

    @classmethod
    def from_config(cls, cfg: Any) -> TinkerBackend:
        """Build from the composed config (``cfg.backend`` is a ``TinkerBackendConfig``).

        Checks the config first (no network), then creates the LoRA training
        client (or restores ``resume_from``) and a sampling client for its weights.
        """
        node = cfg_get(cfg, "backend", None) or cfg
        resolved = validate_config(node)
        check_algorithm(cfg, backend="tinker", forwards_temperature=FORWARDS_TEMPERATURE, docs=DOCS)
        try:
            import tinker  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "backend 'tinker' needs the tinker SDK: pip install -e plugins/tinker "
                f"(or pip install 'tinker>=0.38,<0.39'); import failed: {exc}"
            ) from exc
        tokenizer_name = str(cfg_get(node, "tokenizer", "") or "")
        tokenizer = None
        if tokenizer_name:
            from core.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer_name)
        timeout_s = float(cfg_get(node, "request_timeout_s", 900.0))
        service = make_service_client(api_key=resolved["api_key"], base_url=resolved["base_url"])
        weights_info = weights_info_reader(api_key=resolved["api_key"], base_url=resolved["base_url"])
        lora = {
            "rank": resolved["rank"],
            "seed": cfg_get(node, "seed", None),
            "train_mlp": bool(cfg_get(node, "train_mlp", True)),
            "train_attn": bool(cfg_get(node, "train_attn", True)),
            "train_unembed": bool(cfg_get(node, "train_unembed", True)),
        }
        try:
            if resolved["resume_from"]:
                training = call_blocking(
                    lambda: restore_training_client(
                        service,
                        resolved["resume_from"],
                        base_model=resolved["base_model"],
                        lora=lora,
                        weights_info=weights_info,
                    ),
                    what="tinker create_training_client_from_state_with_optimizer",
                )
            else:
                training = call_blocking(
                    lambda: service.create_lora_training_client(
                        base_model=resolved["base_model"], **lora
                    ).result(),
                    what="tinker create_lora_training_client",
                )
            sampling = call_blocking(
                lambda: training.save_weights_and_get_sampling_client().result(),
                what="tinker save_weights_and_get_sampling_client",
            )
            if tokenizer is None:
                tokenizer = call_blocking(training.get_tokenizer, what="tinker get_tokenizer")
        except BaseException as exc:
            _close_quietly(service, "errored", str(exc))
            if isinstance(exc, Exception) and not isinstance(exc, ConfigError | TrainingError):
                raise TrainingError(
                    f"could not start the Tinker training client: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        return cls(
            service=service,
            training_client=training,
            sampling_client=sampling,
            tokenizer=tokenizer,
            model_id=str(cfg_get(node, "model_id", "") or resolved["base_model"] or "tinker"),
            timeout_s=timeout_s,
            checkpoint_ttl_seconds=cfg_get(node, "checkpoint_ttl_seconds", None),
            base_model=resolved["base_model"],
            lora=lora,
            weights_info=weights_info,
            weight_version=saved_version(str(resolved["resume_from"] or "")) or 0,
        )

    # -- TrainingBackend ------------------------------------------------------

    @property
    def sampler(self) -> TinkerSampler:
        """The sampler; it always serves the weights of the latest ``sync_sampler``."""
        return self._sampler

    @property
    def weight_version(self) -> int:
        """Bumped by every ``sync_sampler``; a resumed checkpoint's own version after
        ``load_state`` (or ``backend.resume_from``)."""
        return self._slot.version

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (``backend.tokenizer``, or the SDK's)."""
        return self._tokenizer

    def model_id(self) -> str:
        """Model name agents pass in their requests."""
        return self._model_id

    async def forward_backward(
        self,
        datums: Sequence[Datum],
        loss_fn: LossName,
        loss_config: dict[str, float] | None = None,
    ) -> ForwardBackwardResult:
        """Send the datums to Tinker's ``forward_backward`` and wait for the gradients."""
        check_loss_fn(loss_fn, backend=self.name)
        loss = remote_loss(
            loss_fn, loss_config, backend=self.name, forwards_temperature=FORWARDS_TEMPERATURE, docs=DOCS
        )
        batch = [tinker_datum(d, loss_fn) for d in datums]
        config = loss.config
        out = await self._call(
            lambda: self._training.forward_backward(batch, loss_fn, config or None),
            "tinker forward_backward",
        )
        logprobs: list[list[float]] = []
        for item in out.loss_fn_outputs or []:
            tensor = item.get("logprobs") if isinstance(item, dict) else None
            if tensor is not None:
                logprobs.append([float(x) for x in tensor.tolist()])
        return ForwardBackwardResult(
            metrics=_with_loss(out.metrics, out.loss_fn_outputs), logprobs=logprobs
        )

    async def optim_step(self, params: AdamParams) -> dict[str, float]:
        """Tinker's Adam step with core's settings (Tinker's own defaults are not used)."""
        from tinker import types

        adam = types.AdamParams(
            learning_rate=params.learning_rate,
            beta1=params.beta1,
            beta2=params.beta2,
            eps=params.eps,
            weight_decay=params.weight_decay,
            grad_clip_norm=params.grad_clip_norm,
        )
        out = await self._call(lambda: self._training.optim_step(adam), "tinker optim_step")
        self._stepped = True
        return {str(k): float(v) for k, v in (out.metrics or {}).items()}

    async def sync_sampler(self) -> TinkerSampler:
        """Save the trained weights and sample from them; in-flight requests finish on the old client."""
        client = await self._call(
            self._training.save_weights_and_get_sampling_client,
            "tinker save_weights_and_get_sampling_client",
        )
        self._slot.rebind(client)
        self._stepped = False
        return self._sampler

    async def save_state(self, path: str) -> str:
        """Save weights and optimizer in Tinker; returns the ``tinker://`` path to resume from."""
        # The version these weights are (or would be) served at: one more after an
        # optim_step that no sync_sampler has served yet.
        name = _checkpoint_name(path, self.weight_version + int(self._stepped))
        out = await self._call(
            lambda: self._training.save_state(name, ttl_seconds=self._ttl), "tinker save_state"
        )
        return str(out.path)

    async def load_state(self, path: str) -> None:
        """Continue from a ``tinker://`` state (weights and optimizer) and sample from it, at
        the weight version it was saved at (the previous version + 1 for a checkpoint
        ``save_state`` did not name)."""
        if not str(path).startswith("tinker://"):
            raise ConfigError(
                f"Tinker can only load tinker:// paths returned by save_state, got {path!r}"
            )
        what = "tinker create_training_client_from_state_with_optimizer"
        if self._closed:
            raise TrainingError(f"{what}: the Tinker backend is closed")
        try:
            self._training = await asyncio.wait_for(
                asyncio.to_thread(
                    restore_training_client,
                    self._service,
                    str(path),
                    base_model=self._base_model,
                    lora=self._lora,
                    weights_info=self._weights_info,
                ),
                self._timeout_s,
            )
        except Exception as exc:
            self._failed = True
            if isinstance(exc, ConfigError | TrainingError):
                raise
            if isinstance(exc, TimeoutError):
                raise TrainingError(f"{what} timed out after {self._timeout_s:.0f}s") from exc
            raise TrainingError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        client = await self._call(
            self._training.save_weights_and_get_sampling_client,
            "tinker save_weights_and_get_sampling_client",
        )
        self._slot.rebind(client, saved_version(str(path)))
        self._stepped = False

    async def aclose(self) -> None:
        """End the Tinker session (``errored`` if a primitive failed); idempotent."""
        if self._closed:
            return
        self._closed = True
        status = "errored" if self._failed else "success"
        try:
            await await_result(
                self._service.close(status), what="tinker close", timeout=60.0
            )
        except Exception as exc:  # closing must not mask the run's own outcome
            if compat.status_code(exc) == 404:  # SkyRL tx: no /sessions/{id}/finish; the SDK still released the client
                logger.info("the Tinker server has no session-finish route; the client was released")
            else:
                logger.warning("closing the Tinker session failed: %s", exc)

    async def _call(self, submit: Any, what: str) -> Any:
        if self._closed:
            raise TrainingError(f"{what}: the Tinker backend is closed")
        try:
            future = submit()
        except Exception as exc:
            self._failed = True
            if isinstance(exc, ConfigError):
                raise
            raise TrainingError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        try:
            return await await_result(future, what=what, timeout=self._timeout_s)
        except TrainingError:
            self._failed = True
            raise


def _close_quietly(service: Any, status: str, detail: str) -> None:
    try:
        call_blocking(lambda: service.close(status, detail[:500]).result(60), what="tinker close")
    except Exception as exc:  # pragma: no cover - best effort on a failing start
        logger.warning("closing the Tinker session after a failed start failed: %s", exc)

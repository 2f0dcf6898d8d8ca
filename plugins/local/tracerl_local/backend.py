"""``LocalBackend``: sampling and training on one machine (``backend=local``).

It satisfies ``core.interfaces.TrainingBackend``. The trained model lives
here; the sampler serves a frozen copy that ``sync_sampler`` refreshes and
versions. Training calls run in a worker thread (one at a time) so the event
loop, which also serves the gateway, stays responsive.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError, TrainingError
from core.interfaces import LossName
from core.types import AdamParams, Datum, ForwardBackwardResult
from tracerl_local.chunked import check_split, split_head
from tracerl_local.config import LocalBackendConfig
from tracerl_local.learning_rate import warn_about_learning_rate
from tracerl_local.losses import parse_loss_config
from tracerl_local.model import cache_argument, enable_checkpointing, load_model, model_forward
from tracerl_local.sampler import ON_UPDATE, LocalSampler
from tracerl_local.training import TrainShape, check_datums, forward_backward_sync, trainer_logprobs

STATE_FILE = "state.pt"
META_FILE = "meta.json"


def _to_backend_config(node: Any) -> LocalBackendConfig:
    """``LocalBackendConfig`` from a node that has its fields and maybe more.

    Fields this backend does not know (a wrapping plugin's own) are left out,
    so a plugin whose config subclasses ``LocalBackendConfig`` can pass its
    node as is; Hydra and ``Plugins.check_config`` already refused typos.
    """
    if type(node) is LocalBackendConfig:
        return node
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    if not isinstance(node, DictConfig):
        node = OmegaConf.structured(node) if dataclasses.is_dataclass(node) else OmegaConf.create(node)
    known = [f.name for f in dataclasses.fields(LocalBackendConfig) if f.name in node and f.name != "name"]
    merged = OmegaConf.merge(OmegaConf.structured(LocalBackendConfig), OmegaConf.masked_copy(node, known))
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, LocalBackendConfig)
    return obj


def _task_texts(task: Any, key: str) -> list[str] | None:
    """The texts ``task.<key>`` (``module:function``) returns; None when the key is empty."""
    spec = str(task.get(key, "") or "")
    if not spec:
        return None
    module_name, _, attr = spec.partition(":")
    try:
        return [str(t) for t in getattr(importlib.import_module(module_name), attr)()]
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"task.{key}={spec!r} cannot be loaded ({exc}); give "
            "'package.module:function' returning a list of texts"
        ) from exc


def _check_train_shape(config: LocalBackendConfig) -> None:
    """Refuse micro-batch and chunk sizes that cannot bound anything."""
    for key in ("train_micro_batch", "train_tokens_per_micro_batch", "train_logprob_chunk"):
        value = getattr(config, key)
        least = 1 if key == "train_micro_batch" else 0
        if value < least:
            raise ConfigError(
                f"backend.{key}={value!r} must be >= {least}"
                + ("" if least else " (0 turns the bound off)")
            )


class LocalBackend:
    """Torch on this machine: a tiny offline model by default, or a Hugging Face model."""

    name = "local"
    truncates_importance_weights = True
    """Applies ``loss_config.tis_cap``: core's loop then caps async runs by default."""

    def __init__(
        self,
        config: LocalBackendConfig,
        seed: int = 0,
        *,
        tokenizer_corpus: list[str] | None = None,
        tokenizer_vocab_size: int = 0,
        tokenizer_tokens: list[str] | None = None,
    ) -> None:
        """Build or load the model and start serving it at weight version 0.

        ``tokenizer_corpus`` / ``tokenizer_vocab_size`` / ``tokenizer_tokens`` shape the
        ``tiny`` preset's tokenizer (the run's task provides them; see ``TaskConfig``).

        Raises:
            ConfigError: bad device/dtype/model, or LoRA without peft.
        """
        if config.num_threads > 0:
            torch.set_num_threads(config.num_threads)
        if config.optimizer.name != "adamw":
            raise ConfigError(
                f"backend.optimizer.name={config.optimizer.name!r} is not supported; use adamw"
            )
        _check_train_shape(config)
        if config.on_update not in ON_UPDATE:
            raise ConfigError(
                f"backend.on_update={config.on_update!r} is not one of {', '.join(ON_UPDATE)}: "
                "continue (interrupted generations go on under the new weights), abort, or finish"
            )
        self.config = config
        self.seed = seed
        self._model, self._tokenizer = load_model(
            config,
            seed,
            corpus=tokenizer_corpus,
            vocab_size=tokenizer_vocab_size,
            whole_tokens=tokenizer_tokens,
        )
        self._model.eval()  # no dropout: trainer and sampler see the same function
        self._cache_arg = cache_argument(self._model)
        if config.train_logprob_chunk > 0:
            model, cache_arg = self._model, self._cache_arg
            check_split(
                model,
                split_head(model),
                lambda ids, mask, pos: model_forward(model, ids, mask, pos, cache_arg=cache_arg),
            )
        if config.gradient_checkpointing:
            enable_checkpointing(self._model)
        self._max_positions = int(self._model.config.max_position_embeddings)
        self._version = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._sampler = LocalSampler(
            self._model,
            self._tokenizer,
            max_positions=self._max_positions,
            max_batch_size=config.max_batch_size,
            batch_wait_ms=config.batch_wait_ms,
            seed=seed,
            context_setting=(
                "backend.tiny.max_position_embeddings"
                if config.model == "tiny"
                else f"max_position_embeddings in {config.model}'s config.json"
            ),
            on_update=config.on_update,
        )

    @classmethod
    def from_config(cls, cfg: Any, *, node: Any = None) -> LocalBackend:
        """Build from the composed run config (``cfg.backend``, ``cfg.seed`` and the task's
        tokenizer corpus and whole tokens, used by the ``tiny`` preset).

        ``node`` replaces ``cfg.backend`` (a wrapping plugin passes its own node);
        only ``LocalBackendConfig`` fields are read from it, extra fields are ignored.
        Warns when ``algorithm.learning_rate`` is far above the usual range for a
        real model (``tracerl_local.learning_rate``).
        """
        task = cfg.get("task") or {}
        config = _to_backend_config(cfg.backend if node is None else node)
        rate = (cfg.get("algorithm") or {}).get("learning_rate")
        if rate is not None:
            warn_about_learning_rate(config.model, config.lora.enabled, float(rate))
        return cls(
            config,
            seed=int(cfg.get("seed", 0) or 0),
            tokenizer_corpus=_task_texts(task, "tokenizer_corpus"),
            tokenizer_vocab_size=int(task.get("tokenizer_vocab_size", 0) or 0),
            tokenizer_tokens=_task_texts(task, "tokenizer_tokens"),
        )

    # -- what the gateway and the loop read -------------------------------------------

    @property
    def sampler(self) -> LocalSampler:
        """The sampler serving the weights of ``weight_version``."""
        return self._sampler

    @property
    def weight_version(self) -> int:
        """Version of the weights the sampler serves; starts at 0, +1 per ``sync_sampler``."""
        return self._version

    @property
    def model(self) -> torch.nn.Module:
        """The model being trained (not the sampler's copy)."""
        return self._model

    def get_tokenizer(self) -> Any:
        """The tokenizer the model reads (the offline tiny one for ``model: tiny``)."""
        return self._tokenizer

    def model_id(self) -> str:
        """``tiny`` or the Hugging Face name/path."""
        return self.config.model

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    def _check_open(self) -> None:
        if self._closed:
            raise TrainingError("the local backend is closed; build a new one")

    # -- training primitives --------------------------------------------------------------

    async def forward_backward(
        self,
        datums: Sequence[Datum],
        loss_fn: LossName,
        loss_config: dict[str, float] | None = None,
    ) -> ForwardBackwardResult:
        """Accumulate gradients of ``loss_fn`` over ``datums`` (see ``tracerl_local.losses``).

        Aggregation: per-token losses times weights, summed over every token of
        every datum, divided by the total weight of the call (token-level mean).
        ``loss_config`` may carry ``temperature`` (and ``top_k``/``top_p``) so
        trainer logprobs use the sampler's settings; temperature 0 means 1.

        Raises:
            ConfigError: unknown loss or key, or datums the model cannot read.
            TrainingError: the backend is closed or the forward/backward failed.
        """
        self._check_open()
        settings = parse_loss_config(loss_fn, loss_config)
        check_datums(datums, len(self._tokenizer), self._max_positions)
        async with self._lock:
            try:
                return await asyncio.to_thread(
                    forward_backward_sync,
                    self._model,
                    list(datums),
                    settings,
                    pad_id=int(self._tokenizer.pad_token_id),
                    cache_arg=self._cache_arg,
                    shape=TrainShape(
                        micro_batch=self.config.train_micro_batch,
                        tokens_per_micro_batch=self.config.train_tokens_per_micro_batch,
                        logprob_chunk=self.config.train_logprob_chunk,
                        bf16_autocast=self.config.train_bf16_autocast,
                    ),
                )
            except (ConfigError, TrainingError):
                raise
            except Exception as exc:
                raise TrainingError(f"local forward_backward failed: {exc!r}") from exc

    async def forward(
        self,
        datums: Sequence[Datum],
        loss_fn: LossName,
        loss_config: dict[str, float] | None = None,
    ) -> ForwardBackwardResult:
        """The trainer's logprobs of each datum's targets, as ``forward_backward`` computes
        them (same ``loss_config`` sampling settings), without a gradient (Tinker's
        ``forward``). Core's fleet probe compares them with an inference server's.

        Raises:
            ConfigError: unknown loss or key, or datums the model cannot read.
            TrainingError: the backend is closed or the forward failed.
        """
        self._check_open()
        settings = parse_loss_config(loss_fn, loss_config)
        check_datums(datums, len(self._tokenizer), self._max_positions)

        def score() -> list[list[float]]:
            device = next(self._model.parameters()).device
            # The arithmetic forward_backward uses (bf16 under backend.train_bf16_autocast).
            autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.config.train_bf16_autocast)
            with torch.no_grad(), autocast:
                logp = trainer_logprobs(
                    self._model, list(datums), settings, int(self._tokenizer.pad_token_id), self._cache_arg
                )
            return [logp[i, : len(d.model_input)].float().cpu().tolist() for i, d in enumerate(datums)]

        async with self._lock:
            try:
                per_datum = await asyncio.to_thread(score)
            except Exception as exc:
                raise TrainingError(f"local forward failed: {exc!r}") from exc
        return ForwardBackwardResult(metrics={}, logprobs=per_datum)

    def _ensure_optimizer(self, params: AdamParams) -> torch.optim.Optimizer:
        if self._optimizer is None:
            trainable = self._trainable()
            if not trainable:
                raise TrainingError("the model has no trainable parameters")
            self._optimizer = torch.optim.AdamW(
                trainable, lr=params.learning_rate, weight_decay=params.weight_decay
            )
        for group in self._optimizer.param_groups:
            group["lr"] = params.learning_rate
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        return self._optimizer

    def _optim_step_sync(self, params: AdamParams) -> dict[str, float]:
        optimizer = self._ensure_optimizer(params)
        max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._trainable(), max_norm))
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise TrainingError(
                f"gradient norm is {grad_norm}; the step was skipped and gradients cleared. "
                "Lower the learning rate or check the advantages for NaN/inf"
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "learning_rate": params.learning_rate}

    async def optim_step(self, params: AdamParams) -> dict[str, float]:
        """Apply accumulated gradients (AdamW, global-norm clipping), then clear them.

        Returns ``grad_norm`` (before clipping) and ``learning_rate``. The
        sampler keeps serving the old weights until ``sync_sampler``.
        """
        self._check_open()
        async with self._lock:
            return await asyncio.to_thread(self._optim_step_sync, params)

    async def sync_sampler(self) -> LocalSampler:
        """Serve the trained weights from the sampler and bump ``weight_version``.

        Generations already running are interrupted and go on under the new weights,
        keeping their tokens (``backend.on_update=continue``, the default; each turn
        then records a segment per version), or finish on the old ones (``finish``).
        """
        self._check_open()
        async with self._lock:
            await asyncio.to_thread(self._sampler.publish, self._model, self._version + 1)
            self._version += 1
        return self._sampler

    async def export_weights(self, path: str) -> str:
        """Write the trained weights where inference servers load them (``sampler=vllm|sglang``).

        Hugging Face layout in directory ``path`` (``config.json`` +
        ``model.safetensors``, ``tracerl_weights.json`` with ``weight_version``),
        which SGLang's ``/update_weights_from_disk``, vLLM's ``reload_weights``
        and ``python -m tracerl_local.serve`` load. Returns the absolute path.

        Raises:
            ConfigError: LoRA training (the servers would need merged weights).
        """
        self._check_open()
        if self.config.lora.enabled:
            raise ConfigError(
                "sampler=vllm|sglang with backend.lora.enabled=true is not supported: the servers "
                "would need the adapters merged into the weights; use sampler=backend, or full "
                "fine-tuning (backend.lora.enabled=false)"
            )
        from tracerl_local.weights_io import export_weights

        async with self._lock:
            return await asyncio.to_thread(export_weights, self._model, path, self._version)

    async def export_model(self, path: str, *, adapter: bool = False) -> str:
        """Write a Hugging Face model directory of the current weights (``python -m core.export``).

        Weights (LoRA merged, or with ``adapter`` the peft adapter), tokenizer with chat
        template and a generation config that stops where the gateway did; see
        ``tracerl_local.export``. Returns the absolute path.

        Raises:
            ConfigError: ``path`` is not new or empty, or ``adapter`` without LoRA.
        """
        self._check_open()
        from tracerl_local.export import export_model

        info = {"base_model": self.config.model, "weight_version": self._version, "seed": self.seed}
        async with self._lock:
            return await asyncio.to_thread(
                export_model, self._model, self._tokenizer, path, adapter=adapter, info=info
            )

    # -- checkpoints ----------------------------------------------------------------------

    def _state_dict(self) -> dict[str, torch.Tensor]:
        state = self._model.state_dict()
        if self.config.lora.enabled:  # the frozen base is rebuilt from the config
            names = {n for n, p in self._model.named_parameters() if p.requires_grad}
            state = {k: v for k, v in state.items() if k in names}
        return state

    async def save_state(self, path: str) -> str:
        """Write weights, optimizer state and weight version into directory ``path``."""
        self._check_open()
        async with self._lock:
            out = Path(path)
            payload = {
                "model": self._state_dict(),
                "optimizer": self._optimizer.state_dict() if self._optimizer else None,
                "weight_version": self._version,
            }

            def write() -> None:
                out.mkdir(parents=True, exist_ok=True)
                tmp = out / (STATE_FILE + ".tmp")
                with tmp.open("wb") as f:  # on disk before the rename publishes it
                    torch.save(payload, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, out / STATE_FILE)
                meta = {
                    "model": self.config.model,
                    "lora": self.config.lora.enabled,
                    "weight_version": self._version,
                    "seed": self.seed,
                }
                (out / META_FILE).write_text(json.dumps(meta, indent=2))

            await asyncio.to_thread(write)
            return str(out)

    async def load_state(self, path: str) -> None:
        """Restore a ``save_state`` directory; the sampler then serves those weights.

        Raises:
            TrainingError: no checkpoint at ``path`` or it does not fit this model.
        """
        self._check_open()
        file = Path(path) / STATE_FILE
        if not file.is_file():
            raise TrainingError(
                f"no local-backend checkpoint at {str(file)!r}; pass a save_state directory"
            )
        async with self._lock:

            def read() -> None:
                payload = torch.load(file, map_location="cpu", weights_only=True)
                try:
                    self._model.load_state_dict(
                        payload["model"], strict=not self.config.lora.enabled
                    )
                except RuntimeError as exc:
                    raise TrainingError(
                        f"checkpoint {str(file)!r} does not fit backend.model={self.config.model!r}: {exc}"
                    ) from exc
                if payload["optimizer"] is not None:
                    optimizer = self._ensure_optimizer(AdamParams())
                    optimizer.load_state_dict(payload["optimizer"])
                self._version = int(payload["weight_version"])
                self._sampler.publish(self._model, self._version)

            await asyncio.to_thread(read)

    async def aclose(self) -> None:
        """Stop the sampler; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._sampler.aclose()

"""``SageMakerBackend``: core's training primitives over a SageMaker training session.

The SDK (``sagemaker.train.training_session``, from ``sagemaker-train``) copies
Tinker's shape with its own pydantic types. Differences handled here:

- **Every loss requires ``weights``**, RL losses included (Tinker's RL losses
  take none), so each datum carries ``target_tokens``, ``weights`` and, for
  RL losses, ``logprobs`` and ``advantages``; the SDK checks this client-side.
- **Temperature** is a per-datum loss input here (``lossFnInputs["temperature"]``,
  listed by the API reference), so with an RL loss and ``algorithm.temperature
  != 1`` every datum carries it as one float32 value (shape ``[1]``); at 1.0 it
  is not sent. ``lossFnConfig`` takes only the two clip thresholds.
- ``ForwardBackwardOutput`` has service metrics (``actor/pg_loss``...) and no
  per-token trainer logprobs, so ``ForwardBackwardResult.logprobs`` stays empty.
- ``AdamParams`` has different defaults (beta2 0.999, eps 1e-8, weight decay
  0.01, clipping off as ``None``): core's values are always sent; core's
  ``grad_clip_norm=0`` (off) becomes ``None``.
- Checkpoints are model package ARNs, not paths; ``save_state`` returns one
  with ``-v<weight version>`` appended (``saved_version`` reads it back, and it
  is cut off before the ARN goes to AWS), so a resumed run serves the version
  it saved instead of starting again at 1.
- ``save_weights_and_get_sampling_client`` and session creation **block**:
  they run on a worker thread.
- **A session bills until stopped**: ``aclose`` stops it, a failed start stops
  it, and an ``atexit`` hook stops it if the process ends without ``aclose``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from core.algo.losses import (
    RemoteLoss,
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
from tracerl_sagemaker.sampler import SageMakerSampler

logger = logging.getLogger(__name__)

DOCS = "docs/backends/sagemaker.md"
RL_KEYS = ("target_tokens", "weights", "logprobs", "advantages")
CE_KEYS = ("target_tokens", "weights")
FORWARDS_TEMPERATURE = True
"""The service takes ``temperature`` as a per-datum loss input (API reference, ``Datum``:
supported ``lossFnInputs`` keys include ``temperature``), so core's training
temperature is forwarded rather than refused."""
CLIP_HIGH_THRESHOLD_MAX = 10.0
"""``lossFnConfig.clip_high_threshold`` must lie in [1, 10] (API reference)."""
LOSS_METRIC_KEYS = ("loss", "actor/pg_loss", "loss:sum", "actor/loss")
LIGHT_INSTALL = (
    "pip install --no-deps 'sagemaker-train>=1.27,<2' && pip install -e 'plugins/sagemaker[aws]'"
)


def _default_region() -> str:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        return region
    import boto3  # reads the local AWS config only; no network

    return boto3.session.Session().region_name or ""


def validate_config(node: Any) -> dict[str, Any]:
    """Check ``backend.*`` for SageMaker without touching AWS; return resolved values.

    Raises:
        ConfigError: naming every missing key (``role_arn``, ``region``, ``base_model``).
    """
    role_arn = str(cfg_get(node, "role_arn", "") or "")
    base_model = str(cfg_get(node, "base_model", "") or "")
    resume_from = str(cfg_get(node, "resume_from", "") or "")
    region = str(cfg_get(node, "region", "") or "") or _default_region()
    missing: dict[str, str] = {}
    if not role_arn:
        missing["backend.role_arn"] = (
            "the IAM role the session runs as, e.g. "
            "backend.role_arn=arn:aws:iam::123456789012:role/SageMakerTrainingSessions"
        )
    if not region:
        missing["backend.region"] = "e.g. backend.region=us-west-2 (or set AWS_REGION)"
    if not base_model and not resume_from:
        missing["backend.base_model"] = (
            "a SageMaker Public Hub model id or ARN (or backend.resume_from=<model package ARN>)"
        )
    if missing:
        raise missing_keys_error("sagemaker", missing, docs=DOCS)
    if not role_arn.startswith("arn:") or ":role/" not in role_arn:
        raise ConfigError(
            f"backend.role_arn must be an IAM role ARN (arn:aws:iam::<account>:role/<name>), got {role_arn!r}"
        )
    if resume_from and ":model-package/" not in package_arn(resume_from):
        raise ConfigError(
            "backend.resume_from must be a model package ARN returned by save_state "
            f"(arn:aws:sagemaker:<region>:<account>:model-package/<group>/<version>), got {resume_from!r}"
        )
    s3 = str(cfg_get(node, "s3_output_path", "") or "")
    if s3 and not s3.startswith("s3://"):
        raise ConfigError(f"backend.s3_output_path must start with s3://, got {s3!r}")
    min_tokens = int(cfg_get(node, "min_sample_max_tokens", 512))
    if min_tokens < 1:
        raise ConfigError(f"backend.min_sample_max_tokens must be >= 1, got {min_tokens!r}")
    return {
        "role_arn": role_arn,
        "region": region,
        "base_model": base_model,
        "resume_from": resume_from,
        "rank": int(cfg_get(node, "lora_rank", 32)),
        "alpha": int(cfg_get(node, "lora_alpha", 64)),
        "model_package_group_arn": str(cfg_get(node, "model_package_group_arn", "") or "") or None,
        "s3_output_path": s3 or None,
        "kms_key_arn": str(cfg_get(node, "kms_key_arn", "") or "") or None,
        "session_name_prefix": str(cfg_get(node, "session_name_prefix", "") or "") or None,
    }


_VERSIONED = re.compile(r"(?P<arn>.*:model-package/.+/\d+)-v(?P<version>\d+)")


def saved_version(checkpoint: str) -> int | None:
    """The weight version a checkpoint ``save_state`` returned holds (its ``-v<N>``); None
    for a bare model package ARN (saved by another tool)."""
    found = _VERSIONED.fullmatch(checkpoint.strip())
    return int(found.group("version")) if found else None


def package_arn(checkpoint: str) -> str:
    """The model package ARN of a checkpoint (``-v<N>`` cut off), as AWS takes it."""
    found = _VERSIONED.fullmatch(checkpoint.strip())
    return found.group("arn") if found else checkpoint.strip()


def make_service_client(resolved: dict[str, Any]) -> Any:
    """The SDK's ``ServiceClient``: the one place the plugin reaches AWS; tests replace it."""
    try:
        import sagemaker.core  # noqa: F401  (ServiceClient needs its Session)
    except ImportError as exc:
        raise ConfigError(
            f"backend 'sagemaker' needs sagemaker-core to create sessions: {LIGHT_INSTALL}"
        ) from exc
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(
        resolved["region"],
        role_arn=resolved["role_arn"],
        model_package_group_arn=resolved["model_package_group_arn"],
        s3_output_path=resolved["s3_output_path"],
        kms_key_arn=resolved["kms_key_arn"],
        session_name_prefix=resolved["session_name_prefix"],
    )


def sagemaker_loss(loss_fn: str, loss_config: dict[str, float] | None) -> RemoteLoss:
    """Core's loss settings as SageMaker takes them (``ConfigError`` before anything is sent)."""
    return _check_bounds(
        remote_loss(
            loss_fn, loss_config, backend="sagemaker", forwards_temperature=FORWARDS_TEMPERATURE, docs=DOCS
        )
    )


def _check_bounds(loss: RemoteLoss) -> RemoteLoss:
    high = loss.config.get("clip_high_threshold", 1.0)
    if not 1.0 <= high <= CLIP_HIGH_THRESHOLD_MAX:
        raise ConfigError(
            f"SageMaker takes clip_high_threshold in [1, {CLIP_HIGH_THRESHOLD_MAX:g}], got {high!r} "
            "(algorithm.loss_config.clip_high must be at most 9). Nothing was sent to the service."
        )
    return loss


def sagemaker_datum(datum: Datum, loss_fn: str, temperature: float = 1.0) -> Any:
    """A typed SDK ``Datum`` for ``loss_fn`` (every loss gets ``weights``; RL losses
    get ``temperature`` when it is not 1.0)."""
    from sagemaker.train.training_session import Datum as SMDatum
    from sagemaker.train.training_session import ModelInput, TensorData, TensorDtype

    keys = CE_KEYS if loss_fn == "cross_entropy" else RL_KEYS
    arrays = loss_inputs(datum, keys, overrides={"advantages": masked_advantages(datum)})
    inputs = {
        key: TensorData(data=a.data, dtype=TensorDtype(a.dtype), shape=a.shape)
        for key, a in arrays.items()
    }
    if temperature != 1.0 and loss_fn != "cross_entropy":
        inputs["temperature"] = TensorData(
            data=[float(temperature)], dtype=TensorDtype.FLOAT32, shape=[1]
        )
    return SMDatum(
        model_input=ModelInput.from_ints([int(t) for t in datum.model_input]),
        loss_fn_inputs=inputs,
    )


def _with_loss(metrics: dict[str, Any] | None) -> dict[str, float]:
    out = {str(k): float(v) for k, v in (metrics or {}).items() if isinstance(v, int | float)}
    if "loss" not in out:
        out["loss"] = next((out[k] for k in LOSS_METRIC_KEYS if k in out), math.nan)
    return out


class SageMakerBackend:
    """``core.interfaces.TrainingBackend`` over one SageMaker training session."""

    name = "sagemaker"

    def __init__(
        self,
        *,
        training_client: Any,
        sampling_client: Any,
        tokenizer: Any,
        model_id: str,
        timeout_s: float,
        min_max_tokens: int,
        lora_plus_lr_ratio: float | None = None,
        weight_version: int = 0,
    ) -> None:
        self._training = training_client
        self._slot: SamplerSlot[Any] = SamplerSlot(sampling_client, weight_version)
        self._stepped = False
        """An ``optim_step`` since the weights were last served: a checkpoint now holds the next version."""
        self._tokenizer = tokenizer
        self._model_id = model_id
        self._timeout_s = timeout_s
        self._lora_plus = lora_plus_lr_ratio
        self._sampler = SageMakerSampler(
            self._slot, tokenizer=tokenizer, timeout_s=timeout_s, min_max_tokens=min_max_tokens
        )
        self._stopped = False
        atexit.register(self._stop_at_exit)

    @classmethod
    def from_config(cls, cfg: Any) -> SageMakerBackend:
        """Build from the composed config (``cfg.backend`` is a ``SageMakerBackendConfig``).

        Checks the config (no AWS call), then creates the training session,
        which blocks until it runs (minutes), or restores ``resume_from``.
        """
        node = cfg_get(cfg, "backend", None) or cfg
        resolved = validate_config(node)
        # what the loop will send, checked before AWS is touched
        _check_bounds(
            check_algorithm(cfg, backend="sagemaker", forwards_temperature=FORWARDS_TEMPERATURE, docs=DOCS)
        )
        try:
            import sagemaker.train.training_session  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"backend 'sagemaker' needs the sagemaker-train SDK: {LIGHT_INSTALL} ({exc})"
            ) from exc
        tokenizer = None
        # Prompts go out as token ids, so the SDK never needs a tokenizer itself.
        tokenizer_name = str(
            cfg_get(node, "tokenizer", "") or cfg_get(node, "hf_model_id", "") or ""
        )
        if tokenizer_name:
            from core.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer_name)
        service = make_service_client(resolved)
        create: dict[str, Any] = {
            "rank": resolved["rank"],
            "alpha": resolved["alpha"],
            "model_package_group_arn": resolved["model_package_group_arn"],
            "s3_output_path": resolved["s3_output_path"],
            "kms_key_arn": resolved["kms_key_arn"],
        }
        create = {k: v for k, v in create.items() if v is not None}
        if resolved["base_model"]:
            create["base_model"] = resolved["base_model"]
        try:
            if resolved["resume_from"]:
                training = call_blocking(
                    lambda: service.create_training_client_from_state_with_optimizer(
                        package_arn(resolved["resume_from"]), **create
                    ),
                    what="sagemaker create_training_client_from_state_with_optimizer",
                )
            else:
                training = call_blocking(
                    lambda: service.create_lora_training_client(**create),
                    what="sagemaker create_lora_training_client",
                )
        except Exception as exc:  # the SDK stops a session it created and then failed to restore
            raise TrainingError(
                f"could not start the SageMaker training session: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            if resolved["resume_from"]:  # sample the restored weights, not the base model
                sampling = call_blocking(
                    training.save_weights_and_get_sampling_client,
                    what="sagemaker save_weights_and_get_sampling_client",
                )
            else:  # an empty model package ARN samples the base model
                sampling = training.create_sampling_client()
            if tokenizer is None:
                tokenizer = call_blocking(training.get_tokenizer, what="sagemaker get_tokenizer")
        except BaseException as exc:
            _stop_quietly(training)
            if isinstance(exc, Exception) and not isinstance(exc, ConfigError | TrainingError):
                raise TrainingError(
                    f"the SageMaker session started but could not be used (it was stopped): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            raise
        return cls(
            training_client=training,
            sampling_client=sampling,
            tokenizer=tokenizer,
            model_id=str(cfg_get(node, "model_id", "") or resolved["base_model"] or "sagemaker"),
            timeout_s=float(cfg_get(node, "request_timeout_s", 900.0)),
            min_max_tokens=int(cfg_get(node, "min_sample_max_tokens", 512)),
            lora_plus_lr_ratio=cfg_get(node, "lora_plus_lr_ratio", None),
            weight_version=saved_version(resolved["resume_from"]) or 0,
        )

    # -- TrainingBackend ------------------------------------------------------

    @property
    def sampler(self) -> SageMakerSampler:
        """The sampler; it always serves the weights of the latest ``sync_sampler``."""
        return self._sampler

    @property
    def weight_version(self) -> int:
        """Bumped by every ``sync_sampler``; a resumed checkpoint's own version after
        ``load_state`` (or ``backend.resume_from``)."""
        return self._slot.version

    @property
    def session_name(self) -> str:
        """The training session's name (what to look for in the console and the bill)."""
        return str(self._training.training_session_name)

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
        """Send typed SDK datums to the session's ``forward_backward`` and wait."""
        check_loss_fn(loss_fn, backend=self.name)
        loss = sagemaker_loss(loss_fn, loss_config)
        batch = [sagemaker_datum(d, loss_fn, loss.temperature) for d in datums]
        config = loss.config
        out = await self._call(
            lambda: self._training.forward_backward(batch, loss_fn, loss_fn_config=config or None),
            "sagemaker forward_backward",
        )
        # No per-token trainer logprobs here: loss_fn_outputs hold actor/* diagnostics.
        return ForwardBackwardResult(metrics=_with_loss(out.metrics), logprobs=[])

    async def optim_step(self, params: AdamParams) -> dict[str, float]:
        """SageMaker's Adam step with core's settings (not SageMaker's defaults)."""
        from sagemaker.train.training_session import AdamParams as SMAdamParams

        adam = SMAdamParams(
            learning_rate=params.learning_rate,
            beta1=params.beta1,
            beta2=params.beta2,
            eps=params.eps,
            weight_decay=params.weight_decay,
            grad_clip_norm=params.grad_clip_norm or None,  # core: 0 = off; SDK: None = off
            lora_plus_lr_ratio=self._lora_plus,
        )
        out = await self._call(lambda: self._training.optim_step(adam), "sagemaker optim_step")
        self._stepped = True
        return {str(k): float(v) for k, v in (out.metrics or {}).items() if isinstance(v, int | float)}

    async def sync_sampler(self) -> SageMakerSampler:
        """Save weights to a model package and sample from it; in-flight requests keep the old one."""
        client = await self._blocking(
            self._training.save_weights_and_get_sampling_client,
            "sagemaker save_weights_and_get_sampling_client",
        )
        self._slot.rebind(client)
        self._stepped = False
        return self._sampler

    async def save_state(self, path: str) -> str:
        """Save weights and optimizer as a model package; returns its ARN with ``-v<version>``
        appended, the weight version these weights are (or would be) served at: one more
        after an ``optim_step`` no ``sync_sampler`` has served yet (``path`` is a label)."""
        version = self.weight_version + int(self._stepped)
        out = await self._call(
            lambda: self._training.save_state(description=f"tracerl checkpoint {path}"[:200]),
            "sagemaker save_state",
        )
        if not out.model_package_arn:
            raise TrainingError("sagemaker save_state completed without a model package ARN")
        return f"{out.model_package_arn}-v{version}"

    async def load_state(self, path: str) -> None:
        """Restore weights and optimizer from a checkpoint ``save_state`` returned and sample
        from them, at the weight version it was saved at (the previous version + 1 for a
        bare model package ARN)."""
        arn = package_arn(str(path))
        if ":model-package/" not in arn:
            raise ConfigError(
                f"SageMaker loads model package ARNs returned by save_state, got {path!r}"
            )
        await self._call(
            lambda: self._training.load_state_with_optimizer(arn), "sagemaker load_state"
        )
        client = await self._blocking(
            self._training.save_weights_and_get_sampling_client,
            "sagemaker save_weights_and_get_sampling_client",
        )
        self._slot.rebind(client, saved_version(str(path)))
        self._stepped = False

    async def aclose(self) -> None:
        """Stop the training session (it bills until stopped); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self._stop_at_exit)
        try:
            await asyncio.to_thread(self._training.stop)
        except Exception as exc:
            logger.error(
                "could not stop SageMaker training session %r: %s. Stop it in the console "
                "or with `aws sagemaker stop-training-session`; it bills until stopped.",
                self.session_name,
                exc,
            )

    # -- helpers --------------------------------------------------------------

    def _stop_at_exit(self) -> None:
        if not self._stopped:
            self._stopped = True
            _stop_quietly(self._training)

    async def _call(self, submit: Any, what: str) -> Any:
        if self._stopped:
            raise TrainingError(f"{what}: the SageMaker session is stopped")
        try:
            future = submit()
        except ConfigError:
            raise
        except Exception as exc:  # e.g. the SDK's own client-side validation
            raise TrainingError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        return await await_result(future, what=what, timeout=self._timeout_s)

    async def _blocking(self, fn: Any, what: str) -> Any:
        if self._stopped:
            raise TrainingError(f"{what}: the SageMaker session is stopped")
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn), self._timeout_s)
        except Exception as exc:
            raise TrainingError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def _stop_quietly(training: Any) -> None:
    try:
        training.stop()
    except Exception as exc:  # pragma: no cover - best effort
        logger.error("could not stop SageMaker training session: %s", exc)

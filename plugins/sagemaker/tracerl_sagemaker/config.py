"""Hydra node ``backend/sagemaker``.

Required: ``role_arn``, ``region`` (here, or ``AWS_REGION`` / ``AWS_DEFAULT_REGION``
/ the AWS config file) and ``base_model`` (unless ``resume_from`` is set).
``from_config`` checks them before anything is sent to AWS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SageMakerBackendConfig:
    """Which model a SageMaker training session trains, where, and at what cost."""

    name: str = "sagemaker"
    """Backend name."""
    role_arn: str = ""
    """Required: IAM role the session runs as (``arn:aws:iam::<account>:role/<name>``)."""
    region: str = ""
    """AWS region; empty reads ``AWS_REGION``, ``AWS_DEFAULT_REGION``, then the AWS config file."""
    base_model: str = ""
    """Required (unless ``resume_from``): a SageMaker Public Hub model id, hub content
    name or hub-content ARN (see ``ServiceClient.list_base_models``)."""
    model_package_group_arn: str = ""
    """Where checkpoints are registered; empty uses the account's ``sagemaker-default`` group."""
    s3_output_path: str = ""
    """``s3://`` prefix for session output; empty uses the SageMaker default bucket."""
    kms_key_arn: str = ""
    """KMS key for the output, if any."""
    session_name_prefix: str = "tracerl"
    """Prefix of the training session's name (shows in the console and the bill)."""
    lora_rank: int = 32
    """LoRA rank."""
    lora_alpha: int = 64
    """LoRA alpha."""
    resume_from: str = ""
    """A model package ARN written by ``save_state``: start from its weights and optimizer."""
    tokenizer: str = ""
    """Empty: the SDK's tokenizer (needs ``transformers`` and the Hugging Face hub).
    Otherwise ``tiny`` or a Hugging Face name or local path."""
    hf_model_id: str = ""
    """Hugging Face id of the base model's tokenizer (used when ``tokenizer`` is empty),
    e.g. when ``base_model`` is a hub ARN whose tokenizer the SDK cannot look up."""
    model_id: str = ""
    """Model name agents send in requests; empty uses ``base_model``."""
    lora_plus_lr_ratio: float | None = None
    """LoRA+ learning-rate multiplier for the B matrices (SageMaker only); null: off."""
    min_sample_max_tokens: int = 512
    """The service refuses ``max_tokens`` below 512: smaller requests are sent as this
    and the reply is cut to the requested length on this side."""
    request_timeout_s: float = 900.0
    """Longest wait for one training operation or sampling request."""
    # SageMaker's own AdamParams defaults (beta2=0.999, eps=1e-8, weight_decay=0.01,
    # no clipping) are never used: every optim_step sends algorithm.* values.

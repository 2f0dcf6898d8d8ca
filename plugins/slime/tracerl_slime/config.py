"""Hydra node ``backend/slime``: the settings only slime has.

Defines ``SlimeBackendConfig`` (registered by ``tracerl_slime.plugin``). Loop
sizes, the algorithm, the task, the runtime and the gateway come from
tracerl's own groups and are translated by ``tracerl_slime.translate``; raw
slime, Megatron and SGLang flags go through ``model_args`` and ``extra_args``
unchanged (``extra_args`` last, so it wins over translated flags).

This module must not import slime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SlimeBackendConfig:
    """slime-only settings of ``python -m core.train backend=slime``."""

    name: str = "slime"
    """Backend name."""
    slime_dir: str = ""
    """slime source checkout holding ``train.py``; empty reads ``$SLIME_DIR``."""
    megatron_dir: str = ""
    """Megatron-LM checkout put on ``PYTHONPATH`` of every Ray worker; empty reads
    ``$MEGATRON_DIR``, else leaves it to the environment (slime's image has /root/Megatron-LM)."""
    hf_checkpoint: str = "tiny"
    """Hugging Face model directory (``--hf-checkpoint``): SGLang serves it and our gateway
    loads its tokenizer and chat template. ``tiny`` is the offline test tokenizer (dry runs)."""
    ref_load: str = ""
    """Megatron ``torch_dist`` checkpoint of the initial weights (``--ref-load``)."""
    save: str = ""
    """Megatron checkpoint directory (``--save``); empty: ``<run_dir>/slime/checkpoints``."""
    model_args: list[str] = field(default_factory=list)
    """Megatron architecture flags of the model (slime's ``scripts/models/<model>.sh``
    ``MODEL_ARGS``), e.g. ``[--num-layers, 36, --hidden-size, 2560, ...]``."""
    ray_address: str = "http://127.0.0.1:8265"
    """Ray dashboard address of ``ray job submit``."""
    python: str = "python3"
    """Interpreter that runs slime's ``train.py`` inside the Ray job."""
    actor_num_nodes: int = 1
    """Training nodes (``--actor-num-nodes``)."""
    actor_num_gpus_per_node: int = 8
    """Training GPUs per node (``--actor-num-gpus-per-node``)."""
    colocate: bool = True
    """Share GPUs between Megatron and SGLang (``--colocate``, CUDA-IPC weight sync)."""
    rollout_num_gpus: int = 0
    """SGLang GPUs when not colocated (``--rollout-num-gpus``); 0 leaves slime's default."""
    rollout_num_gpus_per_engine: int = 1
    """GPUs per SGLang engine (``--rollout-num-gpus-per-engine``, SGLang's tensor parallelism)."""
    tensor_model_parallel_size: int = 1
    """Megatron tensor parallelism (``--tensor-model-parallel-size``)."""
    rollout_max_response_len: int = 1024
    """Response budget of one rollout row (``--rollout-max-response-len``); each turn is
    also capped by ``algorithm.max_tokens``."""
    rollout_max_context_len: int = 0
    """Prompt + response budget (``--rollout-max-context-len``, also the gateway's
    context limit); 0 uses ``gateway.max_context_tokens``."""
    max_tokens_per_gpu: int = 0
    """Enable dynamic batching with this many tokens per GPU (``--use-dynamic-batch-size
    --max-tokens-per-gpu``); 0 keeps slime's fixed micro-batches."""
    router_policy: str = "consistent_hashing"
    """sgl-router policy (``--router-policy``); consistent hashing keeps a session's turns
    on one engine (prefix-cache reuse; the key is the gateway session id)."""
    sglang_mem_fraction_static: float = 0.0
    """SGLang KV-cache share (``--sglang-mem-fraction-static``); 0 leaves slime's default."""
    use_tis: bool = True
    """Truncated importance sampling on rollout logprobs (``--use-tis``)."""
    use_kl_loss: bool = False
    """KL loss to the reference model (``--use-kl-loss``)."""
    kl_loss_coef: float = 0.0
    """KL coefficient (``--kl-loss-coef``)."""
    wandb_project: str = "tracerl"
    """wandb project when ``trainer.loggers`` has wandb."""
    sampler: dict[str, Any] = field(default_factory=dict)
    """Extra ``core.samplers.HttpSamplerConfig`` keys of the SGLang sampler the gateway uses
    (``request_timeout_s``, ``extra_sampling_params``, ...); ``kind`` and ``urls`` are set
    from slime's router."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the Ray job (``--runtime-env-json`` ``env_vars``)."""
    extra_args: list[str] = field(default_factory=list)
    """Raw slime / Megatron / SGLang (``--sglang-*``) / router (``--router-*``) flags,
    appended last, e.g. ``[--sglang-context-length, 32768, --recompute-granularity, full]``."""
    dry_run: bool = False
    """Write the data and configs and print the exact command without launching it."""

"""Hydra node ``backend/verl``: how tracerl's config becomes a verl launch.

Defines ``VerlBackendConfig`` (registered by ``tracerl_verl.plugin``). Most
training settings come from tracerl's own groups (``trainer``, ``algorithm``,
``task``, ``runtime``, ``gateway``) and are translated by
``tracerl_verl.translate``; the fields here are the ones only verl has.
``overrides`` passes raw verl keys through unchanged, last, so it wins.

This module must not import verl: the plugin is listed (``python -m
core.plugins``) in environments where verl is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VerlBackendConfig:
    """verl-only settings of ``python -m core.train backend=verl``."""

    name: str = "verl"
    """Backend name."""
    model: str = "tiny"
    """Hugging Face model directory or name (``actor_rollout_ref.model.path``); ``tiny``
    writes the offline tiny Qwen2 model of ``tracerl-local`` into the run directory."""
    rollout: str = "vllm"
    """verl rollout engine: ``vllm``, ``sglang``, or ``tracerl_cpu`` (test-only CPU replica
    served by the local backend's sampler; needs ``device=cpu``)."""
    device: str = "cuda"
    """``cuda`` (stock verl) or ``cpu`` (test-only shims: a CPU platform, FSDP over gloo;
    verified for verl 0.9.1 only)."""
    nnodes: int = 1
    """Nodes in the Ray cluster (``trainer.nnodes``)."""
    n_gpus_per_node: int = 8
    """GPUs per node (``trainer.n_gpus_per_node``)."""
    trainer_mode: str = "sync"
    """verl v1 trainer mode: ``sync``, ``colocate_async`` or ``separate_async``."""
    strategy: str = "fsdp2"
    """Actor strategy (``actor_rollout_ref.actor.strategy``): ``fsdp``, ``fsdp2`` or ``megatron``."""
    tensor_model_parallel_size: int = 1
    """Rollout tensor parallelism (must divide the GPUs of one replica)."""
    gpu_memory_utilization: float = 0.6
    """Share of GPU memory the rollout engine may take."""
    prompt_length: int = 512
    """Longest prompt verl pads to (``data.max_prompt_length``, ``rollout.prompt_length``).
    Longer gateway prompts are kept exact: the overflow moves into the response, masked."""
    response_length: int = 1024
    """Most tokens after the prompt in one trace row (all turns and tool output together);
    longer rows are cut at this length and counted in ``tracerl/truncated_rows``."""
    micro_batch_size_per_gpu: int = 4
    """Rows per forward/backward micro-batch on one GPU."""
    loss_agg_mode: str = ""
    """verl loss aggregation (``actor.loss_agg_mode``). Empty: ``token-mean``, core's
    ``algorithm.token_mean_over=batch`` (one mean over every generated token of the batch,
    each token of a forked rollout weighing as much as any other). A value here
    (``seq-mean-token-sum``, ``seq-mean-token-mean``, ...) replaces core's token mean."""
    use_kl_loss: bool = False
    """Add a KL penalty to a reference model (needs a reference worker)."""
    kl_loss_coef: float = 0.001
    """KL coefficient when ``use_kl_loss``."""
    rollout_is: str = "token"
    """Truncated importance sampling between rollout and trainer logprobs: ``token``,
    ``sequence`` or empty to disable (``algorithm.rollout_correction.rollout_is``)."""
    rollout_is_threshold: float = 2.0
    """Upper truncation of the importance weight."""
    agent_workers: int = 8
    """verl AgentLoopWorker actors; each runs one gateway and one runtime client."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """verl trackers (``trainer.logger``): console, wandb, tensorboard, ..."""
    project_name: str = "tracerl"
    """Tracker project."""
    experiment_name: str = ""
    """Tracker run name; empty uses the run directory's name."""
    python: str = ""
    """Interpreter that runs ``verl.trainer.main_ppo``; empty uses the current one."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the driver and every Ray worker."""
    dry_run: bool = False
    """Print the exact verl command (and write its inputs) without launching it."""
    overrides: list[str] = field(default_factory=list)
    """Raw verl Hydra overrides, appended last (e.g. ``["actor_rollout_ref.actor.ppo_epochs=2"]``)."""

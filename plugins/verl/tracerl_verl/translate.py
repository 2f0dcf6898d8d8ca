"""tracerl's composed config -> the exact ``verl.trainer.main_ppo`` command.

Defines ``LaunchPaths`` (files the launcher wrote), ``verl_overrides``, ``loss_overrides``,
``verl_env`` and ``verl_command``. Pure functions over the config: the dry
run and the tests call them without starting anything. The mapping table is
in docs/backends/verl.md; ``backend.overrides`` is appended last, so any raw
verl key wins over a translated one.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from typing import Any

from core.algo.losses import parse_loss_spec
from core.errors import ConfigError
from tracerl_verl.advantages import EPS, ESTIMATORS, STD_KINDS

EXT_MODULE = "tracerl_verl.verl_ext"
"""Module verl imports in every process (``VERL_USE_EXTERNAL_MODULES``): our trainer mode,
and the CPU shims when ``TRACERL_VERL_CPU=1``."""

ADV_ESTIMATORS = tuple(ESTIMATORS)
"""``algorithm.name`` values the verl backend accepts: group estimators that count a rollout
once however many rows it has, run as ``tracerl_<name>`` (``tracerl_verl.advantages``)."""

TRAINER_MODES = {
    "sync": "tracerl_sync",
    "colocate_async": "colocate_async",
    "separate_async": "separate_async",
}
"""``backend.trainer_mode`` -> verl ``trainer.v1.trainer_mode``. Sync uses ours (one optimizer
step per batch whatever the rows per rollout); the async modes are verl's own."""


LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""verl 0.9.1's ``actor.loss_agg_mode`` values (``core_algos.agg_loss``)."""


@dataclass(frozen=True)
class LaunchPaths:
    """Files the launcher prepared in the run directory."""

    run_dir: str
    model: str
    train_file: str
    val_file: str
    agent_loop_yaml: str
    has_eval: bool = False


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _env_dict_override(env: dict[str, str]) -> str:
    items = []
    for key, value in sorted(env.items()):
        if '"' in value or "\\" in value:
            raise ConfigError(
                f"backend.env[{key!r}]={value!r}: values may not contain quotes or backslashes"
            )
        items.append(f'{key}:"{value}"')
    return "+ray_kwargs.ray_init.runtime_env.env_vars={" + ",".join(items) + "}"


def verl_env(cfg: Any) -> dict[str, str]:
    """Environment for the verl driver and (through Ray's runtime_env) every worker."""
    backend = cfg.backend
    env = {
        "VERL_USE_EXTERNAL_MODULES": EXT_MODULE,
        "TOKENIZERS_PARALLELISM": "false",
    }
    if str(backend.device) == "cpu":
        env.update({"VERL_PLATFORM": "cpu", "TRACERL_VERL_CPU": "1", "TORCH_COMPILE_DISABLE": "1"})
    env.update({str(k): str(v) for k, v in dict(backend.env or {}).items()})
    return env


def verl_overrides(cfg: Any, paths: LaunchPaths) -> list[str]:
    """The Hydra overrides of ``verl.trainer.main_ppo`` for the composed tracerl config.

    Raises:
        ConfigError: a tracerl setting verl cannot express (name the raw key to use instead).
    """
    b, t, a = cfg.backend, cfg.trainer, cfg.algorithm
    if str(b.device) not in ("cuda", "cpu"):
        raise ConfigError(f"backend.device={b.device!r}; use cuda, or cpu (test-only shims)")
    if str(b.trainer_mode) not in TRAINER_MODES:
        raise ConfigError(
            f"backend.trainer_mode={b.trainer_mode!r}; choose one of {sorted(TRAINER_MODES)}"
        )
    if str(a.name) not in ADV_ESTIMATORS:
        raise ConfigError(
            f"algorithm.name={a.name!r} is not available with backend=verl; use one of "
            f"{ADV_ESTIMATORS} (each counts a rollout once however many rows it has; "
            "reinforce_plus_plus and opo do not). A raw backend.overrides=[algorithm.adv_estimator=...] "
            "gets verl's own estimator, which counts every row of a forked rollout"
        )
    std = str(a.get("std", "population"))
    if std not in STD_KINDS:
        raise ConfigError(f"algorithm.std={std!r}; use one of {STD_KINDS}")
    if str(a.loss) != "ppo":
        raise ConfigError(
            f"algorithm.loss={a.loss!r}: the verl backend trains with verl's PPO-clip policy loss; set "
            "algorithm.loss=ppo, or choose verl's loss with backend.overrides=[actor_rollout_ref.actor.policy_loss.loss_mode=...]"
        )
    if int(t.batch_size) < 1 or int(t.group_size) < 1 or int(t.max_steps) < 1:
        raise ConfigError(
            "trainer.batch_size, trainer.group_size and trainer.max_steps must be >= 1"
        )
    if int(t.group_size) < 2:
        raise ConfigError(
            f"trainer.group_size={int(t.group_size)} with algorithm.name={a.name}: a group "
            "estimator compares the rollouts of one prompt, and a group of one has no baseline "
            "(its advantage is 0, nothing would train); set trainer.group_size >= 2"
        )
    eval_t = float(a.eval_temperature)
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    micro = int(b.micro_batch_size_per_gpu)
    out = [
        # -- trainer
        "trainer.use_v1=true",
        f"trainer.v1.trainer_mode={TRAINER_MODES[str(b.trainer_mode)]}",
        f"trainer.nnodes={int(b.nnodes)}",
        f"trainer.n_gpus_per_node={int(b.n_gpus_per_node)}",
        f"trainer.total_training_steps={int(t.max_steps)}",
        f"trainer.default_local_dir={paths.run_dir}/verl_checkpoints",
        f"trainer.save_freq={int(t.save_every) if int(t.save_every) > 0 else -1}",
        f"trainer.test_freq={int(t.eval_every) if paths.has_eval and int(t.eval_every) > 0 else -1}",
        "trainer.val_before_train=false",
        f"trainer.resume_mode={'auto' if bool(t.resume) else 'disable'}",
        f"trainer.logger=[{','.join(str(x) for x in b.logger)}]",
        f"trainer.project_name={b.project_name}",
        f"trainer.experiment_name={b.experiment_name or paths.run_dir.rstrip('/').rsplit('/', 1)[-1]}",
        # -- data
        f"data.train_files={paths.train_file}",
        f"data.val_files={paths.val_file}",
        f"data.train_batch_size={int(t.batch_size)}",
        f"data.max_prompt_length={int(b.prompt_length)}",
        f"data.max_response_length={int(b.response_length)}",
        "data.filter_overlong_prompts=false",
        "data.dataloader_num_workers=0",
        f"data.seed={int(cfg.seed)}",
        # -- algorithm
        f"algorithm.adv_estimator={ESTIMATORS[str(a.name)]}",
        f"algorithm.norm_adv_by_std_in_grpo={_fmt(bool(a.normalize_std))}",
        f"+algorithm.tracerl_std={std}",
        f"+algorithm.tracerl_eps={EPS}",
        f"algorithm.rollout_correction.rollout_is={b.rollout_is or 'null'}",
        f"algorithm.rollout_correction.rollout_is_threshold={float(b.rollout_is_threshold)}",
        # -- model and actor
        f"actor_rollout_ref.model.path={paths.model}",
        f"{actor}.strategy={b.strategy}",
        f"{actor}.optim.lr={float(a.learning_rate)}",
        f"{actor}.optim.weight_decay={float(a.weight_decay)}",
        f"{actor}.optim.betas=[{float(a.beta1)},{float(a.beta2)}]",
        f"{actor}.optim.clip_grad={float(a.grad_clip_norm)}",
        f"{actor}.grad_clip={float(a.grad_clip_norm)}",
        *loss_overrides(a, b),
        # one optimizer step per batch (see tracerl_verl.trainer_mode)
        f"{actor}.ppo_mini_batch_size={int(t.batch_size)}",
        f"{actor}.ppo_micro_batch_size_per_gpu={micro}",
        f"{actor}.use_kl_loss={_fmt(bool(b.use_kl_loss))}",
        f"{actor}.kl_loss_coef={float(b.kl_loss_coef)}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        # -- rollout
        f"{rollout}.name={b.rollout}",
        f"{rollout}.n={int(t.group_size)}",
        f"{rollout}.temperature={float(a.temperature)}",
        f"{rollout}.val_kwargs.temperature={eval_t}",
        f"{rollout}.val_kwargs.do_sample={_fmt(eval_t > 0)}",
        f"{rollout}.calculate_log_probs=true",
        f"{rollout}.tensor_model_parallel_size={int(b.tensor_model_parallel_size)}",
        f"{rollout}.gpu_memory_utilization={float(b.gpu_memory_utilization)}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={micro}",
        f"{rollout}.agent.num_workers={int(b.agent_workers)}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tracerl_agent",
        f"{rollout}.agent.agent_loop_config_path={paths.agent_loop_yaml}",
        # the agent's reward arrives with the rollout; no reward model workers needed
        "reward.num_workers=1",
    ]
    if str(b.device) == "cpu":
        out += cpu_overrides(cfg)
    out.append(_env_dict_override(verl_env(cfg)))
    out += [str(x) for x in b.overrides]
    return out


def loss_overrides(algorithm: Any, backend: Any) -> list[str]:
    """verl actor keys for ``algorithm.loss_config`` and the token mean; refuses what verl lacks.

    - ``clip_low`` / ``clip_high`` (core's PPO epsilons, 0.2 / 0.2 when absent,
      ``CLIP_DEFAULTS``) -> ``actor.clip_ratio_low`` / ``clip_ratio_high`` (verl's
      epsilons too); the ratio bounds ``clip_low_threshold`` / ``clip_high_threshold``
      are converted to epsilons;
    - ``entropy_coef`` (>= 0, a bonus) -> ``actor.entropy_coeff`` (verl subtracts
      ``entropy_coeff *`` the entropy, aggregated like the loss);
    - ``temperature``: verl's actor tempers its logprobs with ``rollout.temperature``,
      which is ``algorithm.temperature``; a different value is refused;
    - ``top_k`` / ``top_p`` other than off: refused (verl's actor does not apply them);
    - ``algorithm.token_mean_over=batch`` -> ``loss_agg_mode=token-mean`` (verl divides by
      every response token of the mini-batch, which ``tracerl_sync`` makes the whole
      batch) unless ``backend.loss_agg_mode`` names verl's aggregation explicitly;
      ``trained`` (only tokens that carry an advantage) has no verl equivalent.

    Raises:
        ConfigError: an unknown key, a bad value, or a setting verl would silently ignore.
    """
    spec = parse_loss_spec(
        "ppo",  # verl trains PPO-clip (translate refuses other losses)
        algorithm.loss_config,
        backend="verl",
        hint="Pass raw verl keys with backend.overrides=[actor_rollout_ref.actor.<key>=...]",
        temperature=float(algorithm.temperature),  # verl tempers with rollout.temperature
    )
    if "dual_clip" in dict(algorithm.loss_config or {}):
        raise ConfigError(
            "algorithm.loss_config.dual_clip is core's local ppo setting; verl runs its own loss. "
            "Remove it and set verl's own dual-clip through its options (see docs/backends/verl.md)"
        )
    for key in ("top_k", "top_p"):
        if spec.changes(key):
            raise ConfigError(
                f"algorithm.loss_config.{key}={getattr(spec, key)!r}: verl's actor does not apply "
                f"{key} to its logprobs, so the ratio would not account for it; remove it (verl's "
                f"sampling {key} is backend.overrides=[actor_rollout_ref.rollout.{key}=...], "
                "untracked by the loss)"
            )
    mean_over = str(algorithm.get("token_mean_over", "batch"))
    if mean_over != "batch":
        raise ConfigError(
            f"algorithm.token_mean_over={mean_over!r} has no verl equivalent: verl averages over "
            "every response token of the mini-batch (loss_agg_mode=token-mean, what "
            "token_mean_over=batch gives), or per sequence; set algorithm.token_mean_over=batch "
            "(and backend.loss_agg_mode=... for verl's other aggregations)"
        )
    agg = str(backend.loss_agg_mode or "token-mean")
    if agg not in LOSS_AGG_MODES:
        raise ConfigError(
            f"backend.loss_agg_mode={agg!r}; use one of {LOSS_AGG_MODES}, or leave it empty for "
            "token-mean (algorithm.token_mean_over=batch)"
        )
    actor = "actor_rollout_ref.actor"
    return [
        f"{actor}.clip_ratio_low={spec.clip_low}",
        f"{actor}.clip_ratio_high={spec.clip_high}",
        f"{actor}.entropy_coeff={spec.entropy_coef}",
        f"{actor}.loss_agg_mode={agg}",
    ]


def cpu_overrides(cfg: Any) -> list[str]:
    """Settings of the test-only CPU path (docs/research/verl-cpu.md, level c)."""
    n = int(cfg.backend.n_gpus_per_node)
    return [
        "trainer.device=cpu",
        # verl's resource pools require an accelerator resource: declare logical GPUs
        f"+ray_kwargs.ray_init.num_gpus={n}",
        # TransferQueue's controller and storage take logical CPUs; 2 real cores are plenty
        "+ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.include_dashboard=false",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.actor.use_torch_compile=false",
    ]


def verl_command(cfg: Any, paths: LaunchPaths) -> list[str]:
    """``[python, -m, verl.trainer.main_ppo, *overrides]``."""
    python = str(cfg.backend.python) or sys.executable
    return [python, "-m", "verl.trainer.main_ppo", *verl_overrides(cfg, paths)]


def render_command(cmd: list[str], env: dict[str, str]) -> str:
    """A copy-pasteable shell line: the environment, then the command, one override per line."""
    head = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return head + " \\\n  " + " \\\n  ".join(shlex.quote(part) for part in cmd)

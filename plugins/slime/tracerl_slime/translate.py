"""tracerl's composed config -> slime's launch (``ray job submit ... -- python3 train.py ...``).

Defines ``LaunchPaths``, ``slime_train_args``, ``runtime_env``,
``slime_command`` and ``render_command``. Pure functions over the config:
the dry run and the tests call them without starting anything. The mapping
table is in docs/backends/slime.md; ``backend.extra_args`` is appended
last, so a raw slime / Megatron / SGLang flag wins over a translated one
(slime's argparse keeps the last value of a repeated flag).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError

GENERATE_PATH = "tracerl_slime.generate.generate"
"""``--custom-generate-function-path``."""
REWARD_POST_PROCESS_PATH = "tracerl_slime.rewards.post_process_rewards"
"""``--custom-reward-post-process-path``."""
ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
"""``algorithm.name`` values slime accepts as ``--advantage-estimator``."""
SLIME_DIR_PLACEHOLDER = "$SLIME_DIR"
"""Written in place of the slime checkout when neither ``backend.slime_dir`` nor ``$SLIME_DIR`` is set."""


@dataclass(frozen=True)
class LaunchPaths:
    """Files the launcher prepared in ``<run_dir>/slime/``."""

    run_dir: str
    """The run directory (absolute)."""
    train_file: str
    """``--prompt-data`` JSONL."""
    eval_file: str
    """``--eval-prompt-data`` JSONL, or empty."""
    custom_config: str
    """``--custom-config-path`` YAML (the tracerl config under key ``tracerl``)."""
    save_dir: str
    """``--save`` directory."""


def slime_dir(cfg: Any) -> str:
    """The slime checkout: ``backend.slime_dir``, else ``$SLIME_DIR``, else the placeholder."""
    return str(cfg.backend.slime_dir) or os.environ.get("SLIME_DIR", "") or SLIME_DIR_PLACEHOLDER


def _flag(name: str, value: Any) -> list[str]:
    return [f"--{name}", str(value)]


def slime_train_args(cfg: Any, paths: LaunchPaths) -> list[str]:
    """The arguments of slime's ``train.py`` for the composed tracerl config.

    Raises:
        ConfigError: a tracerl setting slime cannot express (the message names the
            raw flag to pass through ``backend.extra_args`` instead).
    """
    b, t, a = cfg.backend, cfg.trainer, cfg.algorithm
    if str(a.name) not in ESTIMATORS:
        raise ConfigError(
            f"algorithm.name={a.name!r} is not a slime advantage estimator; use one of {ESTIMATORS}"
        )
    if str(a.loss) not in ("ppo", "cispo"):
        raise ConfigError(
            f"algorithm.loss={a.loss!r}: the slime backend trains with slime's clipped policy loss; set "
            "algorithm.loss=ppo (or algorithm.name=cispo), or pick slime's loss with "
            "backend.extra_args=[--loss-type,...]"
        )
    if int(t.batch_size) < 1 or int(t.group_size) < 1 or int(t.max_steps) < 1:
        raise ConfigError(
            "trainer.batch_size, trainer.group_size and trainer.max_steps must be >= 1"
        )
    if float(a.temperature) <= 0:
        raise ConfigError(
            f"algorithm.temperature={a.temperature!r}: slime requires a rollout temperature > 0"
        )
    if not b.ref_load and not bool(b.dry_run):
        raise ConfigError(
            "backend.ref_load is empty: slime trains from a Megatron torch_dist checkpoint; convert the "
            "Hugging Face model with slime's tools/convert_hf_to_torch_dist.py and set backend.ref_load"
        )
    clip = dict(a.loss_config or {})
    out: list[str] = []
    # -- cluster
    out += _flag("actor-num-nodes", int(b.actor_num_nodes))
    out += _flag("actor-num-gpus-per-node", int(b.actor_num_gpus_per_node))
    if bool(b.colocate):
        out.append("--colocate")
    elif int(b.rollout_num_gpus) > 0:
        out += _flag("rollout-num-gpus", int(b.rollout_num_gpus))
    out += _flag("rollout-num-gpus-per-engine", int(b.rollout_num_gpus_per_engine))
    out += _flag("tensor-model-parallel-size", int(b.tensor_model_parallel_size))
    # -- model (architecture flags first, as slime's scripts do)
    out += [str(x) for x in b.model_args]
    out += _flag("hf-checkpoint", b.hf_checkpoint)
    if b.ref_load:
        out += _flag("ref-load", b.ref_load)
    out += _flag("save", paths.save_dir)
    if int(t.save_every) > 0:
        out += _flag("save-interval", int(t.save_every))
    if bool(t.resume):
        out += _flag("load", paths.save_dir)
    # -- data: one slime rollout step = one tracerl step (batch_size prompts x group_size)
    out += _flag("prompt-data", paths.train_file)
    out += ["--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata"]
    out += ["--rollout-shuffle"]
    out += _flag("rollout-seed", int(cfg.seed))
    out += _flag("seed", int(cfg.seed))
    out += _flag("num-rollout", int(t.max_steps))
    out += _flag("rollout-batch-size", int(t.batch_size))
    out += _flag("n-samples-per-prompt", int(t.group_size))
    out += _flag("num-steps-per-rollout", 1)
    out += _flag("rollout-max-response-len", int(b.rollout_max_response_len))
    context = int(b.rollout_max_context_len) or int(cfg.gateway.max_context_tokens)
    out += _flag("rollout-max-context-len", context)
    out += _flag("rollout-temperature", float(a.temperature))
    if paths.eval_file:
        out += ["--eval-prompt-data", "tracerl_eval", paths.eval_file]
        out += _flag(
            "eval-interval", int(t.eval_every) if int(t.eval_every) > 0 else int(t.max_steps)
        )
        out += _flag("n-samples-per-eval-prompt", 1)
        out += _flag("eval-temperature", float(a.eval_temperature))
    # -- our hooks and config
    out += _flag("custom-generate-function-path", GENERATE_PATH)
    out += _flag("custom-reward-post-process-path", REWARD_POST_PROCESS_PATH)
    out += _flag("custom-config-path", paths.custom_config)
    out += _flag("router-policy", b.router_policy)
    if float(b.sglang_mem_fraction_static) > 0:
        out += _flag("sglang-mem-fraction-static", float(b.sglang_mem_fraction_static))
    # -- algorithm and optimizer
    out += _flag("advantage-estimator", a.name)
    if not bool(a.normalize_std):
        out.append("--disable-grpo-std-normalization")
    out += _flag("eps-clip", float(clip.get("clip_low", 0.2)))
    out += _flag("eps-clip-high", float(clip.get("clip_high", 0.2)))
    if bool(b.use_kl_loss):
        out += ["--use-kl-loss", *_flag("kl-loss-coef", float(b.kl_loss_coef))]
    if bool(b.use_tis):
        out += ["--use-tis"]
    out += ["--optimizer", "adam"]
    out += _flag("lr", float(a.learning_rate))
    out += _flag("adam-beta1", float(a.beta1))
    out += _flag("adam-beta2", float(a.beta2))
    out += _flag("weight-decay", float(a.weight_decay))
    out += _flag("clip-grad", float(a.grad_clip_norm))
    if int(b.max_tokens_per_gpu) > 0:
        out += ["--use-dynamic-batch-size", *_flag("max-tokens-per-gpu", int(b.max_tokens_per_gpu))]
    # -- logging
    loggers = [str(x) for x in t.loggers]
    if "wandb" in loggers:
        out += ["--use-wandb", *_flag("wandb-project", b.wandb_project)]
    if "tensorboard" in loggers:
        out += ["--use-tensorboard", *_flag("tb-project-name", f"{paths.run_dir}/tensorboard")]
    out += [str(x) for x in b.extra_args]
    return out


def runtime_env(cfg: Any) -> dict[str, Any]:
    """Ray's ``--runtime-env-json``: the environment of the job and every actor."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    megatron = str(cfg.backend.megatron_dir) or os.environ.get("MEGATRON_DIR", "")
    if megatron:
        env["PYTHONPATH"] = megatron
    env.update({str(k): str(v) for k, v in dict(cfg.backend.env or {}).items()})
    return {"env_vars": env}


def slime_command(cfg: Any, paths: LaunchPaths) -> list[str]:
    """``ray job submit --address ... --runtime-env-json ... -- python3 <slime>/train.py <args>``."""
    b = cfg.backend
    return [
        "ray",
        "job",
        "submit",
        f"--address={b.ray_address}",
        f"--runtime-env-json={json.dumps(runtime_env(cfg), sort_keys=True)}",
        "--",
        str(b.python),
        f"{slime_dir(cfg).rstrip('/')}/train.py",
        *slime_train_args(cfg, paths),
    ]


def render_command(cmd: list[str]) -> str:
    """A copy-pasteable shell command, one flag (with its values) per line."""
    lines: list[list[str]] = []
    for part in cmd:
        if part.startswith("--") or not lines or part in ("--",):
            lines.append([part])
        else:
            lines[-1].append(part)
    quoted = []
    for parts in lines:
        # keep $SLIME_DIR expandable by the shell that runs the printed command
        quoted.append(
            " ".join(p if p.startswith(SLIME_DIR_PLACEHOLDER) else shlex.quote(p) for p in parts)
        )
    return " \\\n  ".join(quoted)

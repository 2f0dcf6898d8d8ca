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

from core.algo.losses import parse_loss_spec
from core.errors import ConfigError
from tracerl_slime.rewards import STD_KINDS

GENERATE_PATH = "tracerl_slime.generate.generate"
"""``--custom-generate-function-path``."""
REWARD_POST_PROCESS_PATH = "tracerl_slime.rewards.post_process_rewards"
"""``--custom-reward-post-process-path``."""
ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
"""``algorithm.name`` values slime accepts as ``--advantage-estimator``."""
CISPO_ESTIMATORS = ("grpo", "cispo")
"""``algorithm.name`` values that combine with ``algorithm.loss=cispo``.

slime has no loss flag for CISPO: ``--advantage-estimator cispo`` selects it
(GRPO's advantages, then ``compute_cispo_loss`` instead of the PPO-clip loss;
``slime/backends/megatron_utils/loss.py`` lines 763 and 1035 at THUDM/slime
624b824a898ab0ec1fcb4d373004c7f3852bf515). ``--loss-type`` only picks between
``policy_loss``, ``sft_loss`` and ``custom_loss``."""
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


def estimator_for(algorithm: Any) -> str:
    """slime's ``--advantage-estimator`` for ``algorithm.name`` and ``algorithm.loss``.

    slime picks the policy loss from the estimator (see ``CISPO_ESTIMATORS``), so
    ``loss=cispo`` becomes ``--advantage-estimator cispo`` and the estimator
    ``cispo`` is refused with ``loss=ppo`` (it would train CISPO).

    Raises:
        ConfigError: a name/loss pair slime cannot train as written.
    """
    name, loss = str(algorithm.name), str(algorithm.loss)
    if name not in ESTIMATORS:
        raise ConfigError(
            f"algorithm.name={name!r} is not a slime advantage estimator; use one of {ESTIMATORS}"
        )
    if loss == "cispo":
        if name not in CISPO_ESTIMATORS:
            raise ConfigError(
                f"algorithm.loss=cispo with algorithm.name={name!r}: slime trains CISPO only as "
                "--advantage-estimator cispo (GRPO advantages); set algorithm.name=grpo or cispo, "
                "or algorithm.loss=ppo"
            )
        return "cispo"
    if loss == "ppo":
        if name == "cispo":
            raise ConfigError(
                "algorithm.name=cispo makes slime train the CISPO loss, but algorithm.loss=ppo; "
                "set algorithm.loss=cispo (or algorithm.name=grpo for PPO-clip)"
            )
        return name
    raise ConfigError(
        f"algorithm.loss={loss!r}: the slime backend trains slime's policy loss, ppo (PPO-clip) or "
        "cispo; set algorithm.loss=ppo or cispo, or pick slime's loss with "
        "backend.extra_args=[--loss-type,...]"
    )


def loss_flags(algorithm: Any) -> list[str]:
    """slime flags for ``algorithm.loss_config`` and the token mean; refuses what slime lacks.

    - ``clip_low`` / ``clip_high`` (defaults per loss as in core, ``CLIP_DEFAULTS``:
      CISPO has no lower clip unless asked) -> ``--eps-clip`` / ``--eps-clip-high``;
      ratio bounds ``clip_low_threshold`` / ``clip_high_threshold`` are converted;
    - ``entropy_coef`` -> ``--entropy-coef``;
    - ``temperature``: slime tempers its training logprobs with ``--rollout-temperature``
      (``get_responses``, loss.py line 133 at the pinned commit), which is
      ``algorithm.temperature``; a different ``loss_config.temperature`` is refused;
    - ``top_k`` / ``top_p`` other than off: refused (slime's trainer does not apply them);
    - ``algorithm.token_mean_over=batch`` -> ``--calculate-per-token-loss`` (one mean over
      every trained token of the step, as core); ``trained`` has no slime equivalent.

    Raises:
        ConfigError: an unknown key or a setting slime would silently ignore.
    """
    spec = parse_loss_spec(
        str(algorithm.loss),
        algorithm.loss_config,
        backend="slime",
        hint="Raw slime flags go in backend.extra_args.",
        temperature=float(algorithm.temperature),  # slime tempers with --rollout-temperature
    )
    if "dual_clip" in dict(algorithm.loss_config or {}):
        raise ConfigError(
            "algorithm.loss_config.dual_clip is core's local ppo setting; slime runs its own loss. "
            "Remove it and set slime's own dual-clip through its options (see docs/backends/slime.md)"
        )
    for key in ("top_k", "top_p"):
        if spec.changes(key):
            raise ConfigError(
                f"algorithm.loss_config.{key}={getattr(spec, key)!r}: slime's trainer does not apply "
                f"{key} to its logprobs; remove it (set slime's sampling with --rollout-top-p/"
                "--rollout-top-k in backend.extra_args if you must, knowing the ratio will not "
                "account for it)"
            )
    out = _flag("eps-clip", spec.clip_low) + _flag("eps-clip-high", spec.clip_high)
    if spec.entropy_coef:
        out += _flag("entropy-coef", spec.entropy_coef)
    mean_over = str(algorithm.get("token_mean_over", "batch"))
    if mean_over == "batch":
        out.append("--calculate-per-token-loss")
    else:
        raise ConfigError(
            f"algorithm.token_mean_over={mean_over!r} has no slime equivalent: slime averages over "
            "every trained token of the step (--calculate-per-token-loss, what token_mean_over=batch "
            "emits) or per rollout (its default, pass backend.extra_args to change the reducer); "
            "set algorithm.token_mean_over=batch"
        )
    return out


def slime_train_args(cfg: Any, paths: LaunchPaths) -> list[str]:
    """The arguments of slime's ``train.py`` for the composed tracerl config.

    Raises:
        ConfigError: a tracerl setting slime cannot express (the message names the
            raw flag to pass through ``backend.extra_args`` instead).
    """
    b, t, a = cfg.backend, cfg.trainer, cfg.algorithm
    estimator = estimator_for(a)
    std = str(a.get("std", "population"))
    if std not in STD_KINDS:  # read by tracerl_slime.rewards in slime's rollout process
        raise ConfigError(f"algorithm.std={std!r}; use one of {STD_KINDS}")
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
    algorithm_flags = loss_flags(a)
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
    out += _flag("advantage-estimator", estimator)
    if not bool(a.normalize_std):
        out.append("--disable-grpo-std-normalization")
    out += algorithm_flags
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

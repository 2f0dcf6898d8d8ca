"""``python -m core.train``: compose the config and train with the chosen backend.

Plugins are loaded and their config nodes registered *before* Hydra composes,
so ``backend=<name>`` works for any installed plugin, and an unknown or
missing backend fails with a message naming the installed ones (and the
``pip install`` for an in-tree one) instead of Hydra's generic error.

A fresh run stores how it was started in ``<run_dir>/tracerl_run.yaml``
(``core.rundir.runconfig``); ``run_dir=R trainer.resume=true`` composes with those
overrides again, refusing one that would change what the run trains before anything
in ``R`` is written.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from core.plugins.manager import Plugins


def check_driving_settings(cfg: DictConfig, backend: str) -> None:
    """Refuse core-loop settings a backend with its own trainer would silently ignore."""
    from core.errors import ConfigError

    sampler = cfg.get("sampler")
    kind = str(sampler.get("kind", "backend")) if sampler is not None else "backend"
    if kind != "backend":
        raise ConfigError(
            f"sampler={kind} is core's loop sampling from a fleet while a driven backend trains; "
            f"backend {backend!r} runs its own trainer and its own rollout engines. Keep "
            f"sampler=backend and choose the engine in the backend's config (see "
            f"docs/backends/{backend}.md; verl: its rollout name vllm or sglang, slime: its SGLang "
            "router), or use backend=local with sampler=vllm|sglang"
        )
    mode = str(cfg.trainer.get("mode", "sync"))
    if mode != "sync":
        raise ConfigError(
            f"trainer.mode={mode} is core's loop; backend {backend!r} runs its own trainer. Use its "
            f"own asynchronous switch instead (see docs/backends/{backend}.md; verl: "
            "backend.trainer_mode=separate_async) and keep trainer.mode=sync"
        )
    reward = cfg.get("reward")
    if reward is not None and str(reward.get("name", "agent")) != "agent":
        raise ConfigError(
            f"reward={reward.name} scores rollouts in core's loop (and python -m core.eval); backend "
            f"{backend!r} runs its own trainer, which would train on the agent's reward instead. "
            "Use the backend's own reward function setting, or compute the reward in the agent"
        )
    if float(cfg.algorithm.get("tis_cap") or 0.0):
        raise ConfigError(
            f"algorithm.tis_cap is applied by core's loop; backend {backend!r} runs its own "
            f"trainer. Use its own truncated importance sampling setting (see "
            f"docs/backends/{backend}.md; slime: backend.use_tis) and drop algorithm.tis_cap"
        )


def _record_run(cfg: DictConfig, given: list[str]) -> None:
    """Store how a fresh run was started, or add a resume's overrides to the record."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from core.rundir.runconfig import add_resume, write_run_record
    from core.trainer.guards import check_fresh_run_dir

    run_dir = Path(str(cfg.run_dir))
    if bool(cfg.trainer.resume):
        add_resume(run_dir, given)
        return
    check_fresh_run_dir(run_dir)  # before the record of an earlier run could be replaced
    choices: dict[str, str] = {}
    if HydraConfig.initialized():
        runtime_choices = HydraConfig.get().runtime.choices
        choices = {str(k): str(v) for k, v in runtime_choices.items() if not str(k).startswith("hydra/") and v is not None}
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    write_run_record(run_dir, overrides=given, config={str(k): v for k, v in config.items()}, choices=choices)


def _run(cfg: DictConfig, plugins: Plugins, given: list[str]) -> int:
    from core.trainer.guards import check_policy_settings, check_policy_support
    from core.trainer.policy_config import read_policies

    spec = plugins.backend(str(cfg.backend.name))
    check_policy_support([str(name) for name in cfg.get("policies") or {}], spec)  # before anything starts
    check_policy_settings(cfg, read_policies(cfg.get("policies")), spec)
    if spec.kind == "driving":
        check_driving_settings(cfg, str(spec.name))
        backend = spec.factory(cfg)
        return int(backend.run(cfg))
    from core.trainer import run_training
    from core.trainer.policies import check_policy_modes

    policies = [str(name) for name in cfg.get("policies") or {}]
    check_policy_modes(policies, sampler=str((cfg.get("sampler") or {}).get("kind", "backend")))
    _record_run(cfg, given)
    return run_training(cfg, plugins)  # its last lines say where the run is and what next


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    from core.config import PRIMARY_CONFIG
    from core.entry import load_checked_plugins, resume_argv, run_hydra
    from core.errors import ConfigError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        composed_argv = resume_argv(argv)  # a resume composes with the run's stored overrides
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plugins = load_checked_plugins(composed_argv)
    if plugins is None:
        return 2
    given = [a for a in argv if not a.startswith("-")]

    def body(cfg: DictConfig) -> int:
        plugins.check_config(cfg)
        return _run(cfg, plugins, given)

    return run_hydra(PRIMARY_CONFIG, composed_argv, body, module="core.train")


if __name__ == "__main__":
    sys.exit(main())

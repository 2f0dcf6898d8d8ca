"""``backend=verl``: prepare the run directory and launch stock ``verl.trainer.main_ppo``.

Defines ``VerlBackend`` (a ``core.interfaces.DrivingBackend``) and
``prepare_launch``. Preparing writes, under ``<run_dir>/verl/``:

- ``train.parquet`` / ``val.parquet``: the task's payloads in verl's shape;
- ``tracerl.yaml``: the composed tracerl config, read by every agent-loop worker
  (runtime, gateway, task, algorithm);
- ``agent_loops.yaml``: registers ``TracerlAgentLoop`` as ``tracerl_agent``;
- ``model/`` when ``backend.model=tiny``: the offline tiny model and tokenizer.

Then verl runs as a child process (its Ray driver owns the loop), and its
exit code is ours. ``backend.dry_run=true`` prints the command and stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from core.errors import ConfigError
from tracerl_verl.translate import LaunchPaths, render_command, verl_command, verl_env

AGENT_NAME = "tracerl_agent"


def _write_tiny_model(cfg: Any, out: Path) -> str:
    """Save ``tracerl-local``'s tiny model + tokenizer where verl can load them."""
    if (out / "config.json").exists():
        return str(out)
    try:
        from tracerl_local.config import TinyModelConfig
        from tracerl_local.model import build_tiny_model
    except ImportError as exc:
        raise ConfigError(
            "backend.model=tiny needs tracerl-local (`pip install -e plugins/local`); or set "
            "backend.model to a Hugging Face model directory"
        ) from exc
    from core.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = build_tiny_model(tokenizer, TinyModelConfig(), int(cfg.seed))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def prepare_launch(cfg: Any) -> LaunchPaths:
    """Write data, configs and (for ``tiny``) the model; return where they are."""
    from core.rollout import prepare_data
    from tracerl_verl.data import write_verl_dataset

    run_dir = Path(str(cfg.run_dir)).resolve()
    work = run_dir / "verl"
    work.mkdir(parents=True, exist_ok=True)
    train, evals = prepare_data(cfg, run_dir)
    train_file = write_verl_dataset(train, work / "train.parquet", agent_name=AGENT_NAME)
    val_file = write_verl_dataset(evals or train[:1], work / "val.parquet", agent_name=AGENT_NAME)
    tracerl_yaml = work / "tracerl.yaml"
    OmegaConf.save(cfg, tracerl_yaml, resolve=True)
    agent_yaml = work / "agent_loops.yaml"
    agent_yaml.write_text(
        OmegaConf.to_yaml(
            [
                {
                    "name": AGENT_NAME,
                    "_target_": "tracerl_verl.agent_loop.TracerlAgentLoop",
                    "tracerl_config": str(tracerl_yaml),
                }
            ]
        )
    )
    model = str(cfg.backend.model)
    if model == "tiny":
        model = _write_tiny_model(cfg, work / "model")
    return LaunchPaths(
        run_dir=str(run_dir),
        model=model,
        train_file=str(train_file),
        val_file=str(val_file),
        agent_loop_yaml=str(agent_yaml),
        has_eval=bool(evals),
    )


class VerlBackend:
    """Launches verl's trainer with our agent loop (``DrivingBackend``)."""

    name = "verl"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def command(self, cfg: Any | None = None) -> tuple[list[str], dict[str, str]]:
        """Prepare the run directory; return verl's command and the extra environment."""
        cfg = cfg or self.cfg
        paths = prepare_launch(cfg)
        return verl_command(cfg, paths), verl_env(cfg)

    def run(self, cfg: Any) -> int:
        """Run verl to completion (or print the command when ``backend.dry_run``); its exit code.

        Before either, the model's chat template is certified as ``python -m core.train`` does for
        the backends it drives (``core.gateway.certify.certify_model_on_start``: the same cache,
        ``template_certificate.json`` in the run directory, refused unless
        ``gateway.allow_uncertified_template``), with the tokenizer verl's workers load.
        """
        from core.gateway.certify import certify_model_on_start

        paths = prepare_launch(cfg)
        certify_model_on_start(paths.model, cfg.gateway, out_dir=Path(paths.run_dir),
                               dry_run=bool(cfg.backend.dry_run))
        cmd, env = verl_command(cfg, paths), verl_env(cfg)
        line = render_command(cmd, env)
        print(f"verl command:\n{line}", flush=True)
        if bool(cfg.backend.dry_run):
            return 0
        full_env = {**os.environ, **env}
        # Ray's workers inherit PYTHONPATH; keep the current import path (editable checkouts).
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in [os.getcwd(), full_env.get("PYTHONPATH", "")] if p
        )
        try:
            return subprocess.run(cmd, env=full_env, check=False).returncode
        except FileNotFoundError as exc:
            raise ConfigError(
                f"cannot start verl with {cmd[0]!r}: {exc}; set backend.python"
            ) from exc
        except KeyboardInterrupt:
            print("verl interrupted", file=sys.stderr)
            return 130

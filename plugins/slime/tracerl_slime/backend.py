"""``backend=slime``: prepare the run directory and submit slime's ``train.py`` to Ray.

Defines ``SlimeBackend`` (a ``core.interfaces.DrivingBackend``),
``prepare_launch``, ``slime_installed`` and ``INSTALL_HINT``. Preparing
writes, under ``<run_dir>/slime/``:

- ``train.jsonl`` / ``eval.jsonl``: the task's payloads as slime prompt data;
- ``tracerl_custom.yaml``: ``--custom-config-path``; slime sets its top-level
  key ``tracerl`` (the composed tracerl config) on ``args``, which is how
  every rollout process gets the runtime, gateway, task and algorithm.

Then ``ray job submit`` runs slime (its driver owns the loop) and its exit
code is ours. ``backend.dry_run=true`` prints the command and stops; without
slime installed, a real launch prints how to install it and exits 2.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from tracerl_slime.translate import LaunchPaths, render_command, slime_command, slime_dir

INSTALL_HINT = """\
slime is not installed here. It is not on PyPI (the PyPI package `slime` is unrelated)
and needs its patched Megatron-LM and SGLang. Either use slime's image
(docker pull slimerl/slime:latest) or install from source on the GPU nodes:
  git clone https://github.com/THUDM/slime.git && cd slime && bash build_conda.sh
  pip install -e .   # then: export SLIME_DIR=$PWD
and install tracerl + tracerl-slime in the same environment
(pip install -e <tracerl> -e <tracerl>/plugins/slime).
Then start Ray (ray start --head ...) and rerun; backend.dry_run=true prints the
command without any of this. See docs/backends/slime.md."""


def slime_installed(cfg: Any) -> list[str]:
    """What is missing for a real launch (empty when slime can start)."""
    missing = []
    if importlib.util.find_spec("slime") is None or importlib.util.find_spec("slime.utils") is None:
        missing.append("the `slime` package (THUDM/slime) is not importable")
    root = slime_dir(cfg)
    if root.startswith("$") or not (Path(root) / "train.py").is_file():
        missing.append(
            f"slime's train.py not found in {root!r} (set backend.slime_dir or $SLIME_DIR)"
        )
    if shutil.which("ray") is None:
        missing.append("the `ray` command is not on PATH")
    return missing


def prepare_launch(cfg: Any) -> LaunchPaths:
    """Write the prompt data and the custom config; return where they are."""
    import yaml
    from omegaconf import OmegaConf

    from core.rollout import prepare_data
    from tracerl_slime.data import write_slime_dataset

    run_dir = Path(str(cfg.run_dir)).resolve()
    work = run_dir / "slime"
    work.mkdir(parents=True, exist_ok=True)
    train, evals = prepare_data(cfg, run_dir)
    if not train:
        raise ConfigError(
            f"the task produced no training payloads (task.train_path={cfg.task.train_path!r})"
        )
    train_file = write_slime_dataset(train, work / "train.jsonl")
    eval_file = write_slime_dataset(evals, work / "eval.jsonl") if evals else None
    custom = work / "tracerl_custom.yaml"
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    container["run_dir"] = str(run_dir)
    custom.write_text(yaml.safe_dump({"tracerl": container}, sort_keys=False))
    save_dir = str(cfg.backend.save) or str(work / "checkpoints")
    return LaunchPaths(
        run_dir=str(run_dir),
        train_file=str(train_file),
        eval_file=str(eval_file) if eval_file else "",
        custom_config=str(custom),
        save_dir=save_dir,
    )


class SlimeBackend:
    """Submits slime's trainer with our generate function (``DrivingBackend``)."""

    name = "slime"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def command(self, cfg: Any | None = None) -> list[str]:
        """Prepare the run directory; return the ``ray job submit`` command."""
        cfg = cfg or self.cfg
        return slime_command(cfg, prepare_launch(cfg))

    def run(self, cfg: Any) -> int:
        """Submit slime and wait (or print the command when ``backend.dry_run``); its exit code."""
        dry = bool(cfg.backend.dry_run)
        if not dry:
            missing = slime_installed(cfg)
            if missing:
                print("error: cannot launch slime:\n  - " + "\n  - ".join(missing), file=sys.stderr)
                print(INSTALL_HINT, file=sys.stderr)
                return 2
        from core.gateway.certify import certify_model_on_start

        paths = prepare_launch(cfg)
        # As python -m core.train does for the backends it drives: the same cache, the certificate
        # in the run directory, refused unless gateway.allow_uncertified_template.
        certify_model_on_start(str(cfg.backend.hf_checkpoint), cfg.gateway, out_dir=Path(paths.run_dir),
                               dry_run=bool(cfg.backend.dry_run))
        cmd = slime_command(cfg, paths)
        print(f"slime command:\n{render_command(cmd)}", flush=True)
        if dry:
            if slime_installed(cfg):
                print(
                    "(dry run; slime is not installed here: see docs/backends/slime.md)",
                    file=sys.stderr,
                )
            return 0
        try:
            return subprocess.run(cmd, env=dict(os.environ), check=False).returncode
        except FileNotFoundError as exc:
            raise ConfigError(
                f"cannot start {cmd[0]!r}: {exc}; install Ray (pip install 'ray[default]')"
            ) from exc
        except KeyboardInterrupt:
            print(
                "slime job submission interrupted (the Ray job may still run: ray job stop <id>)",
                file=sys.stderr,
            )
            return 130

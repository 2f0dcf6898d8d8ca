"""``python -m core.export``: a run's checkpoint as a Hugging Face model directory to serve.

Usage::

    python -m core.export outputs/my-run exported/my-model            # the run's latest checkpoint
    python -m core.export outputs/my-run/checkpoints/step_000100 exported/step100
    python -m core.export outputs/my-run exported/adapter --adapter   # LoRA: the adapter, not merged
    python -m core.export outputs/my-run exported/cpu backend.device=cpu   # overrides win

The run's config comes from its run directory (``tracerl_run.yaml``, see
``core.rundir.runconfig``), so nothing of the training command is repeated; overrides
given after the two paths win. The backend is built as the run built it, the checkpoint
loaded, and the backend's ``export_model`` writes the directory (the local backend:
``tracerl_local.export``). A backend without ``export_model`` is refused, saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, TracerlError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from core.plugins.manager import Plugins

__all__ = ["export_checkpoint", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m core.export",
        description="Write a Hugging Face model directory (weights, tokenizer, chat template, "
        "generation config) from a run's checkpoint, for transformers, vLLM or SGLang.",
    )
    parser.add_argument("source", help="a run directory (its latest checkpoint) or <run_dir>/checkpoints/step_N")
    parser.add_argument("out", help="the model directory to write (new or empty)")
    parser.add_argument("overrides", nargs="*", help="config overrides applied over the run's own (key=value)")
    parser.add_argument(
        "--adapter", action="store_true", help="with LoRA: write the peft adapter instead of merged weights"
    )
    return parser


def _compose(overrides: list[str], plugins: Plugins) -> DictConfig:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from core.config import CONFIG_MODULE, PRIMARY_CONFIG, VERSION_BASE, register_configs

    register_configs(plugins)
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=VERSION_BASE):
        cfg = compose(config_name=PRIMARY_CONFIG, overrides=overrides)
    plugins.check_config(cfg)
    return cfg


def _step_of(source: str) -> int | None:
    from core.rundir.checkpoint import STATE_FILE, latest_checkpoint

    state = Path(source) / STATE_FILE
    if state.is_file():
        return int(json.loads(state.read_text())["step"])
    found = latest_checkpoint(Path(source))
    return found.step if found is not None else None


async def export_checkpoint(cfg: DictConfig, plugins: Plugins, source: str, out: str, *, adapter: bool) -> str:
    """Build the backend ``cfg`` names, load the checkpoint ``source`` and export it to ``out``.

    Raises:
        ConfigError: a backend with its own trainer, one without ``export_model``, or a
            ``source`` that is no checkpoint.
    """
    from core.eval.cli import resolve_checkpoint

    spec = plugins.backend(str(cfg.backend.name))
    if spec.kind != "driven":
        raise ConfigError(
            f"backend {spec.name!r} runs its own trainer and writes its own checkpoints; export "
            f"them with its tools (see docs/backends/{spec.name}.md)"
        )
    state = resolve_checkpoint(source)
    backend: Any = spec.factory(cfg)
    try:
        if not callable(getattr(backend, "export_model", None)):
            raise ConfigError(
                f"backend {spec.name!r} cannot write a model directory (it has no export_model): "
                "its weights live where it trains them; get them from that service"
            )
        await backend.load_state(state)
        return str(await backend.export_model(out, adapter=adapter))
    finally:
        await backend.aclose()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    from core.entry import load_checked_plugins, run_argv

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        overrides = run_argv(list(args.overrides), args.source)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plugins = load_checked_plugins(overrides)
    if plugins is None:
        return 2
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = _compose(overrides, plugins)
    except (HydraException, OmegaConfBaseException) as exc:  # a bad override: Hydra's words
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        path = asyncio.run(export_checkpoint(cfg, plugins, args.source, args.out, adapter=args.adapter))
    except TracerlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    step = _step_of(args.source)
    print(f"exported {'the adapter' if args.adapter else 'the model'} of step {step} to {path}")
    print(f"load it:  transformers.AutoModelForCausalLM.from_pretrained({path!r})")
    if not args.adapter:
        print(f"serve it: vllm serve {path}   or   python -m sglang.launch_server --model-path {path}")
    print("see docs/real_models.md, 'Export and serve'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

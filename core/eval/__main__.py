"""``python -m core.eval``: evaluate a checkpoint, the base model or an endpoint.

Usage::

    python -m core.eval eval.checkpoint=outputs/<date>/<time>        # a run's latest checkpoint
    python -m core.eval                                              # the backend's base model
    python -m core.eval eval.endpoint=https://api.openai.com/v1 eval.model=gpt-4o-mini
    python -m core.eval eval.samples_per_prompt=8 eval.temperature=1.0 reward=math
    python -m core.eval compare A/results.jsonl B/results.jsonl

The config is ``core.train``'s (task, backend, runtime, reward, gateway) plus
the ``eval`` section (``core.eval.config.EvalConfig``); docs/eval.md lists it.
"""

from __future__ import annotations

import sys
from typing import Any

from core.errors import ConfigError, PluginError, TracerlError

EVAL_CONFIG = "eval"
"""Primary config name of ``python -m core.eval`` (``core/conf/eval.yaml``)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        from core.eval.compare import compare_main

        return compare_main(argv[1:])
    from core.config import CONFIG_MODULE, VERSION_BASE, register_configs
    from core.plugins import load_plugins
    from core.train import requested_choices

    plugins = load_plugins()
    for warning in plugins.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    try:
        register_configs(plugins)
        choices = requested_choices(argv)
        if "runtime" in choices:
            plugins.runtime(choices["runtime"])
        if "reward" in choices:
            plugins.reward(choices["reward"])
        if "backend" in choices and not any(a.startswith("eval.endpoint=") for a in argv):
            plugins.backend(choices["backend"])
    except (ConfigError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import hydra

    result: dict[str, int] = {}

    @hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=EVAL_CONFIG, version_base=VERSION_BASE)
    def _hydra_entry(cfg: Any) -> None:
        import asyncio

        from core.eval.cli import evaluate_config, print_summary

        try:
            plugins.check_config(cfg)
            summary = asyncio.run(evaluate_config(cfg, plugins))
            print_summary(summary)
            result["code"] = 0
        except TracerlError as exc:
            print(f"error: {exc}", file=sys.stderr)
            result["code"] = 1

    saved = sys.argv
    sys.argv = [saved[0] if saved else "core.eval", *argv]
    try:
        _hydra_entry()
    finally:
        sys.argv = saved
    return result.get("code", 0)


if __name__ == "__main__":
    sys.exit(main())

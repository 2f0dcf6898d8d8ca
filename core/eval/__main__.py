"""``python -m core.eval``: evaluate a checkpoint, the base model or an endpoint.

Usage::

    python -m core.eval eval.checkpoint=outputs/<date>/<time>        # a run's latest checkpoint
    python -m core.eval                                              # the backend's base model
    python -m core.eval eval.endpoint=https://api.openai.com/v1 eval.model=gpt-4o-mini
    python -m core.eval eval.samples_per_prompt=8 eval.temperature=1.0 reward=math
    python -m core.eval compare A/results.jsonl B/results.jsonl

The config is ``core.train``'s (task, backend, runtime, reward, gateway) plus
the ``eval`` section (``core.eval.config.EvalConfig``); docs/eval.md lists it.
With ``eval.checkpoint`` the run's own overrides (``<run_dir>/tracerl_run.yaml``)
come first, so a checkpoint loads into the model it was trained as; overrides
given here win.
"""

from __future__ import annotations

import sys
from typing import Any

EVAL_CONFIG = "eval"
"""Primary config name of ``python -m core.eval`` (``core/conf/eval.yaml``)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        from core.eval.compare import compare_main

        return compare_main(argv[1:])
    from core.entry import load_checked_plugins, run_argv, run_hydra

    checkpoint = [a.split("=", 1)[1] for a in argv if a.startswith("eval.checkpoint=")]
    if checkpoint and checkpoint[-1]:
        from core.errors import ConfigError

        try:
            argv = run_argv(argv, checkpoint[-1])
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    endpoint = any(a.startswith("eval.endpoint=") for a in argv)
    plugins = load_checked_plugins(argv, skip=("backend",) if endpoint else ())
    if plugins is None:
        return 2

    def body(cfg: Any) -> int:
        import asyncio

        from core.eval.cli import evaluate_config, print_summary

        plugins.check_config(cfg)
        print_summary(asyncio.run(evaluate_config(cfg, plugins)))
        return 0

    return run_hydra(EVAL_CONFIG, argv, body, module="core.eval")


if __name__ == "__main__":
    sys.exit(main())

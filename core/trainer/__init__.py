"""The training loop for backends core drives (local, Tinker, SageMaker)."""

from __future__ import annotations

from typing import Any

__all__ = ["run_training"]


def run_training(cfg: Any, plugins: Any) -> int:
    """Run the GRPO loop described by ``cfg``; returns an exit code."""
    import sys

    print(
        "tracerl: the training loop for driven backends is not built yet "
        f"(backend={cfg.backend.name!s}); the config composed fine. Try --cfg job to see it.",
        file=sys.stderr,
    )
    return 3

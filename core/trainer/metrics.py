"""Where step metrics go: the console, ``metrics.jsonl``, and wandb/tensorboard when asked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from core.errors import ConfigError


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per step to ``<run_dir>/metrics.jsonl`` and forwards
    to optional loggers."""

    def __init__(self, run_dir: Path, loggers: list[str], *, config: dict[str, Any]) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._wandb: Any = None
        self._tb: Any = None
        for name in loggers:
            if name == "wandb":
                try:
                    import wandb
                except ImportError as exc:
                    raise ConfigError("trainer.loggers has 'wandb' but wandb is not installed") from exc
                self._wandb = wandb.init(config=config, dir=str(run_dir))
            elif name == "tensorboard":
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as exc:
                    raise ConfigError(
                        "trainer.loggers has 'tensorboard' but tensorboard is not installed"
                    ) from exc
                self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            elif name not in ("jsonl", "console"):
                raise ConfigError(
                    f"unknown logger {name!r} in trainer.loggers; use jsonl, console, wandb, tensorboard"
                )

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _finite(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        step = int(record.get("step", 0))
        numeric = {k: v for k, v in clean.items() if isinstance(v, int | float) and v is not None}
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file (later records of a step win)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def console_line(record: dict[str, Any]) -> str:
    """One readable line per step."""
    parts = [f"step {record['step']:>4}"]
    for key, fmt in (
        ("reward/mean", "reward {:.3f}"),
        ("eval/reward_mean", "eval {:.3f}"),
        ("rollouts/failed", "failed {}"),
        ("train/logprob_diff_max", "lp-gap {:.1e}"),
        ("time/step", "{:.2f}s"),
    ):
        if record.get(key) is not None:
            parts.append(fmt.format(record[key]))
    return "  ".join(parts)

"""Data sets of payloads, a resumable, seeded order over them, and a task's data.

A data set is JSONL (one object per line with a ``payload`` object) or
Parquet (a ``payload`` column holding structs or JSON strings). Each payload
is forwarded to the agent as is. ``prepare_data`` gives a task's train and eval
payloads (core's loop, ``python -m core.eval``, verl and slime all start from it).
"""

from __future__ import annotations

import importlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.errors import ConfigError


def load_payloads(path: str | Path) -> list[dict[str, Any]]:
    """Read every row's ``payload``; a bad file or row raises ``ConfigError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data set {str(path)!r} does not exist; set task.train_path to a file")
    if path.suffix == ".parquet":
        return _load_parquet(path)
    rows: list[dict[str, Any]] = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("payload"), dict):
                raise ConfigError(
                    f"{path}:{lineno}: each line must be an object with a 'payload' object, "
                    f"got {line.strip()[:80]!r}"
                )
            rows.append(row["payload"])
    if not rows:
        raise ConfigError(f"data set {str(path)!r} has no rows")
    return rows


def _load_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(
            f"{path} is Parquet; install pyarrow (`pip install tracerl[parquet]`)"
        ) from exc
    table = pq.read_table(path)
    if "payload" not in table.column_names:
        raise ConfigError(f"{path}: no 'payload' column (columns: {table.column_names})")
    rows = []
    for i, value in enumerate(table.column("payload").to_pylist()):
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: row {i} payload is {type(value).__name__}, not an object")
        rows.append(value)
    if not rows:
        raise ConfigError(f"data set {str(path)!r} has no rows")
    return rows


@dataclass
class DataOrder:
    """Seeded shuffling by epoch; its position is saved in checkpoints so a
    resumed run sees exactly the rows it would have seen."""

    size: int
    """Number of rows."""
    seed: int
    """Base seed; epoch e is shuffled with ``seed + e``."""
    epoch: int = 0
    """Current epoch."""
    cursor: int = 0
    """Next position inside the epoch's permutation."""

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[int]:
        """The next ``n`` row indices, wrapping into a new epoch as needed."""
        out: list[int] = []
        while len(out) < n:
            perm = self._permutation(self.epoch)
            take = perm[self.cursor : self.cursor + (n - len(out))]
            out.extend(take)
            self.cursor += len(take)
            if self.cursor >= self.size:
                self.epoch += 1
                self.cursor = 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "size": self.size, "seed": self.seed}

    def restore(self, state: dict[str, int]) -> None:
        if state.get("size") != self.size or state.get("seed") != self.seed:
            raise ConfigError(
                f"checkpoint was written for a data set of {state.get('size')} rows and seed "
                f"{state.get('seed')}, but this run has {self.size} rows and seed {self.seed}; "
                "resume with the same data and seed, or start a new run_dir"
            )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])


def _import_attr(spec: str, what: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} must look like 'package.module:function', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what} {spec!r} cannot be imported: {exc}") from exc


def prepare_data(cfg: DictConfig, run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and eval payloads; a task with a generator writes them into the run directory."""
    task = cfg.task
    train_path, eval_path = str(task.train_path), str(task.eval_path)
    if not train_path:
        if not task.generator:
            raise ConfigError("set task.train_path (JSONL or Parquet with a 'payload' field)")
        generate = _import_attr(str(task.generator), "task.generator")
        train_path = str(run_dir / "data" / "train.jsonl")
        eval_path = eval_path or str(run_dir / "data" / "eval.jsonl")
        if not Path(train_path).exists():
            kwargs = OmegaConf.to_container(task.generator_kwargs, resolve=True)
            generate(train_path, eval_path, seed=int(cfg.seed), **kwargs)  # type: ignore[arg-type]
    train = load_payloads(train_path)
    evals = load_payloads(eval_path) if eval_path else []
    return train, evals

"""How a run was started: ``<run_dir>/tracerl_run.yaml``, and the overrides a later command reuses.

A fresh ``python -m core.train`` writes the record once (its command-line overrides, the
config groups chosen and the resolved config); each resume appends its own overrides.
``python -m core.train run_dir=R trainer.resume=true``, ``python -m core.eval
eval.checkpoint=R`` and ``python -m core.export R OUT`` read it back, so none of them needs
the training overrides repeated. A run written before the record existed is read from
Hydra's ``.hydra/`` (``overrides.yaml``, ``config.yaml``, ``hydra.yaml``).

Defines ``RunRecord``, ``write_run_record``, ``add_resume``, ``read_run_record``,
``run_dir_of``, ``resume_overrides`` (the stored overrides with the resume's own, a
conflicting one refused) and ``reuse_overrides`` (stored first, the command's own win).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigError

__all__ = [
    "RESUMABLE",
    "RUN_FILE",
    "RunRecord",
    "add_resume",
    "override_key",
    "read_run_record",
    "resume_overrides",
    "reuse_overrides",
    "run_dir_of",
    "write_run_record",
]

RUN_FILE = "tracerl_run.yaml"

RESUMABLE: tuple[str, ...] = (
    "run_dir",
    "trainer.resume",
    "trainer.max_steps",
    "trainer.save_every",
    "trainer.eval_every",
    "trainer.eval_size",
    "trainer.keep_checkpoints",
    "trainer.keep_best_checkpoint",
    "trainer.save_traces",
    "trainer.keep_traces",
    "trainer.progress",
    "trainer.loggers",
    "trainer.canary",
    "trainer.rollout_timeout_s",
    "trainer.max_concurrent_rollouts",
    "backend.device",
    "backend.num_threads",
    "backend.max_batch_size",
    "backend.batch_wait_ms",
    "backend.train_micro_batch",
    "backend.train_tokens_per_micro_batch",
    "backend.train_logprob_chunk",
    "backend.gradient_checkpointing",
    "backend.train_bf16_autocast",
    "backend.on_update",
    "runtime.num_processes",
    "eval.",
    "sampler",
    "sampler.",
    "hydra.",
)
"""Settings a resume may change: how long, how often, where and how fast, never what is
trained (a key ending in ``.`` covers everything under it)."""

_NOT_REUSED = ("run_dir", "trainer.resume", "hydra.")
"""Stored overrides a later command does not inherit: it has its own output and no resume."""


@dataclass(frozen=True)
class RunRecord:
    """What a run directory says about how its run was started."""

    overrides: list[str]
    """The command-line overrides of the fresh run, as typed (``task=lookup``, ``seed=3``)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The config the run started with (resolved where the record is ours)."""
    choices: dict[str, str] = field(default_factory=dict)
    """The option of each config group (``backend: local``, ``task: succ_digit``)."""
    resumes: list[list[str]] = field(default_factory=list)
    """The overrides of each resume, in order."""
    path: Path = Path(RUN_FILE)
    """The file it was read from."""


def run_dir_of(path: str | Path) -> Path:
    """The run directory of ``path``: a run directory, one of its checkpoints, or a checkpoint's backend dir."""
    where = Path(path)
    for candidate in (where, *where.parents[:3]):
        if candidate.name == "checkpoints":
            return candidate.parent
    return where


def _is_resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE)


def override_key(override: str) -> str:
    """The config key or group an override sets (``+a.b=1`` and ``~a.b`` give ``a.b``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_override(override)
    except Exception as exc:  # Hydra's grammar errors: keep its words, name the override
        raise ConfigError(f"cannot read the override {override!r}: {exc}") from exc
    return str(parsed.key_or_group)


def _value(override: str) -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(override)
    return None if parsed.is_delete() else parsed.value()


_SECRET_WORDS = ("api_key", "token", "secret", "password")
REDACTED = "<redacted>"


def _redacted(node: Any) -> Any:
    """``node`` with the values of secret-looking keys (``sampler.api_key``,
    ``gateway.admin_token``) replaced; ``*_env`` keys name variables and stay."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            name = str(key).lower()
            secret = any(w in name for w in _SECRET_WORDS) and not name.endswith("_env")
            out[key] = REDACTED if secret and isinstance(value, str) and value else _redacted(value)
        return out
    if isinstance(node, list):
        return [_redacted(v) for v in node]
    return node


def write_run_record(run_dir: Path, *, overrides: Sequence[str], config: dict[str, Any], choices: dict[str, str]) -> Path:
    """Write ``tracerl_run.yaml`` for a fresh run (written to a temporary file, then renamed).

    The overrides are stored as typed (as Hydra's ``.hydra/overrides.yaml`` does: a resume
    composes with them); in the resolved config secret-looking values are redacted.
    """
    record = {
        "overrides": list(overrides),
        "choices": dict(choices),
        "resumes": [],
        "config": _redacted(config),
    }
    return _write(run_dir, record)


def _write(run_dir: Path, record: dict[str, Any]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_FILE
    tmp = run_dir / (RUN_FILE + ".tmp")
    header = "# How this run was started (python -m core.train); resume, eval and export read it.\n"
    tmp.write_text(header + yaml.safe_dump(record, sort_keys=False, default_flow_style=False))
    os.replace(tmp, path)
    return path


def add_resume(run_dir: Path, overrides: Sequence[str]) -> None:
    """Append a resume's overrides to the record (nothing when the run has no record of ours)."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return
    record = yaml.safe_load(path.read_text()) or {}
    record.setdefault("resumes", []).append(list(overrides))
    _write(run_dir, record)


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def read_run_record(run_dir: Path) -> RunRecord | None:
    """The record of ``run_dir``: ``tracerl_run.yaml``, else Hydra's ``.hydra/``; None when neither exists.

    Raises:
        ConfigError: ``tracerl_run.yaml`` exists but is not a record (edited or torn).
    """
    path = run_dir / RUN_FILE
    if path.is_file():
        data = _read_yaml(path)
        if not isinstance(data, dict) or not isinstance(data.get("overrides"), list):
            raise ConfigError(
                f"{path} is not a run record (no 'overrides' list); restore it, or pass the run's "
                "overrides on the command line"
            )
        return RunRecord(
            overrides=[str(o) for o in data["overrides"]],
            config=dict(data.get("config") or {}),
            choices={str(k): str(v) for k, v in (data.get("choices") or {}).items()},
            resumes=[[str(o) for o in r] for r in data.get("resumes") or []],
            path=path,
        )
    hydra_dir = run_dir / ".hydra"
    overrides = _read_yaml(hydra_dir / "overrides.yaml")
    if not isinstance(overrides, list):
        return None
    config = _read_yaml(hydra_dir / "config.yaml")
    hydra = _read_yaml(hydra_dir / "hydra.yaml")
    choices = ((hydra or {}).get("hydra") or {}).get("runtime", {}).get("choices") or {}
    return RunRecord(
        overrides=[str(o) for o in overrides],
        config=config if isinstance(config, dict) else {},
        choices={str(k): str(v) for k, v in choices.items() if v is not None},
        path=hydra_dir / "overrides.yaml",
    )


def _stored_value(record: RunRecord, key: str) -> tuple[bool, Any]:
    """``(known, value)`` of ``key`` when the run started: its override, group choice or config value."""
    for override in reversed(record.overrides):
        if override_key(override) == key:
            return True, _value(override)
    if "." not in key and key in record.choices:
        return True, record.choices[key]
    node: Any = record.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return node != REDACTED, node


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def _merge(stored: Sequence[str], given: Sequence[str]) -> list[str]:
    """The stored overrides (less those not reused and those ``given`` sets again), then ``given``."""
    again = {override_key(o) for o in given}
    kept = []
    for override in stored:
        key = override_key(override)
        if key in again or any(key == k or (k.endswith(".") and key.startswith(k)) for k in _NOT_REUSED):
            continue
        kept.append(override)
    return [*kept, *given]


def resume_overrides(record: RunRecord, given: Sequence[str]) -> list[str]:
    """The overrides a resume composes with: the run's own, then those of the resume.

    An override of the resume that would change what is trained (any key outside
    ``RESUMABLE``) is refused unless it repeats the run's value.

    Raises:
        ConfigError: an override that conflicts with the run, naming the run's value and what to do.
    """
    conflicts = []
    for override in given:
        key = override_key(override)
        if _is_resumable(key):
            continue
        known, stored = _stored_value(record, key)
        new = _value(override)
        if known and _same(new, stored):
            continue
        was = f"the run has {stored!r}" if known else "the run did not set it"
        conflicts.append(f"{override} ({was})")
    if conflicts:
        allowed = ", ".join(k + ("*" if k.endswith(".") else "") for k in RESUMABLE)
        raise ConfigError(
            f"trainer.resume=true continues the run with the settings it was started with "
            f"(read from {record.path}), and these overrides would change what it trains: "
            f"{'; '.join(conflicts)}. Drop them to resume, or start a new run_dir to train "
            f"with other settings. A resume may change only: {allowed}. Nothing in the run "
            "directory was changed"
        )
    return _merge(record.overrides, given)


def reuse_overrides(record: RunRecord, given: Sequence[str]) -> list[str]:
    """The run's overrides (less ``run_dir`` and resume), then ``given``, which win: for eval and export."""
    return _merge(record.overrides, given)

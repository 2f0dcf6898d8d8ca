"""Several policies in one run on the local backend (docs/multi_agent.md): a backend per
policy, each trained only on the rows it sampled, with its own optimizer, weight version,
sampler behind the gateway and checkpoint, resumed together; one policy (no ``policies``)
keeps today's checkpoint layout and metrics.

Real local torch backend (tiny model), real gateway, the two-role task's agent in a
local-runtime process; a few steps, so what is asserted is mechanics, not learning
(tests/learning/test_multi_policy_learning.py has that).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from core.errors import ConfigError
from core.plugins import load_plugins
from core.rundir.checkpoint import STATE_FILE, checkpoint_dir
from core.rundir.metrics import read_metrics
from core.rundir.traces import read_traces, rows_of, trace_path
from core.testing.fakes import compose, fake_backend_plugin
from core.trainer.loop import Trainer

HERE = Path(__file__).parent
TWO = ["+policies.up={}", "+policies.down={}"]
AGENT = ["task.agent=loop_agents:two_roles_parity", f"+task.agent_env.PYTHONPATH={HERE}"]
"""Rewards every reply by a property a random model's replies vary in: a signal in every group."""


def _cfg(run_dir: Path, *extra: str, plugins: Any = None) -> tuple[Any, Any]:
    plugins = plugins or load_plugins()
    cfg = compose(
        [
            "task=two_roles",
            f"run_dir={run_dir}",
            "trainer.max_steps=2",
            "trainer.batch_size=2",
            "trainer.group_size=4",
            "trainer.eval_every=0",
            "trainer.save_every=1",
            "trainer.canary=false",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            "runtime.num_processes=1",
            "task.generator_kwargs.rows=20",
            *extra,
        ],
        plugins,
    )
    return cfg, plugins


def _train(cfg: Any, plugins: Any) -> Trainer:
    trainer = Trainer(cfg, plugins)
    assert asyncio.run(trainer.run()) == 0
    return trainer


def _weights(run_dir: Path, step: int, policy: str | None) -> dict[str, torch.Tensor]:
    backend = checkpoint_dir(run_dir, step) / "backend"
    path = (backend / policy if policy else backend) / "state.pt"
    return dict(torch.load(path, map_location="cpu", weights_only=True)["model"])


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.integration
def test_each_policy_trains_its_own_rows_into_its_own_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "two"
    trainer = _train(*_cfg(run_dir, *TWO, *AGENT))
    assert trainer.policies.names == ["up", "down"]
    assert trainer.policies.versions() == {"up": 2, "down": 2}
    up, down = trainer.policies["up"], trainer.policies["down"]
    assert up is not down and up.model is not down.model
    # The gateway samples each policy's turns with that policy's sampler.
    assert trainer.gateway.sampler_of("up") is up.sampler and trainer.gateway.sampler_of("down") is down.sampler
    # Both started from the same weights (one seed) and trained on different rows.
    start = _weights(run_dir, 1, "up")
    assert not _same(_weights(run_dir, 2, "up"), _weights(run_dir, 2, "down"))
    assert not _same(start, _weights(run_dir, 2, "up"))

    state = json.loads((checkpoint_dir(run_dir, 2) / STATE_FILE).read_text())
    assert set(state["policies"]) == {"up", "down"}
    assert state["backend_path"] == str(checkpoint_dir(run_dir, 2) / "backend")
    assert any(name.startswith("up/") for name in state["backend_files"])  # sizes cover every policy

    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    for r in records:
        for policy in ("up", "down"):
            assert r[f"policy/{policy}/weight_version"] == r["step"]
            assert r[f"policy/{policy}/rollouts"] == 8 and r[f"policy/{policy}/turns"] == 8
            assert r[f"policy/{policy}/tokens"] == 8  # one token a reply
            assert r[f"policy/{policy}/staleness_mean"] == 0.0
            assert isinstance(r[f"policy/{policy}/loss"], float)
            assert 0.0 <= r[f"policy/{policy}/reward"] <= 1.0
    # Rows never mix policies, and each turn was sampled by its own policy's weights.
    rows = [row for rollout in read_traces(trace_path(run_dir, "train", 2)).rollouts for row in rows_of(rollout)]
    by_policy = {p: [r for r in rows if r.policy() == p] for p in ("up", "down")}
    assert len(by_policy["up"]) == len(by_policy["down"]) == 8
    for row in rows:
        row.validate()
        assert all(span.weight_version == 1 for span in row.turns)


@pytest.mark.integration
def test_a_resumed_run_restores_every_policy_and_continues_exactly(tmp_path: Path) -> None:
    full = tmp_path / "full"
    _train(*_cfg(full, *TWO, *AGENT))
    split = tmp_path / "split"
    _train(*_cfg(split, *TWO, *AGENT, "trainer.max_steps=1"))
    resumed = _train(*_cfg(split, *TWO, *AGENT, "trainer.resume=true"))
    assert resumed.policies.versions() == {"up": 2, "down": 2}
    for policy in ("up", "down"):
        assert _same(_weights(full, 2, policy), _weights(split, 2, policy)), policy
    optimizer = torch.load(checkpoint_dir(split, 2) / "backend" / "up" / "state.pt", weights_only=True)["optimizer"]
    assert optimizer is not None and optimizer["state"]  # each policy's Adam moments are saved


@pytest.mark.integration
def test_resuming_with_other_policies_is_refused_naming_both(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _train(*_cfg(run_dir, *TWO, "trainer.max_steps=1"))
    with pytest.raises(ConfigError, match=r"holds policies \['down', 'up'\], but this run trains one"):
        _train(*_cfg(run_dir, "trainer.resume=true"))
    with pytest.raises(ConfigError, match=r"this run configures policies \['coder', 'up'\]"):
        _train(*_cfg(run_dir, "+policies.up={}", "+policies.coder={}", "trainer.resume=true"))


@pytest.mark.integration
def test_one_policy_keeps_todays_checkpoint_and_metrics(tmp_path: Path) -> None:
    """No ``policies``: one backend, its checkpoint where it always was, no ``policy/*`` keys
    (the fake backend: no torch needed for the layout)."""
    run_dir = tmp_path / "one"
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    trainer = _train(*_cfg(run_dir, "backend=fake", "task=succ_digit", plugins=plugins))
    assert trainer.policies.names == ["default"] and trainer.backend is trainer.policies.default
    state = json.loads((checkpoint_dir(run_dir, 2) / STATE_FILE).read_text())
    assert "policies" not in state
    assert state["backend_path"] == str(checkpoint_dir(run_dir, 2) / "backend")
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert records and not any(k.startswith("policy/") for r in records for k in r)

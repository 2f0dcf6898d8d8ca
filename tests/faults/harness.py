"""What the fault-injection tests share: a config, a spy on the loop, a hook in the sampler.

Everything here is real except the policy: the gateway serves HTTP, the local
runtime runs agent processes (``fault_agents`` in this folder), and
``core.trainer.loop.Trainer`` drives them with the recording ``FakeBackend``
(or, in the sampler test, with a real inference server behind the gateway).
The spy only reads what the loop computed; the hook runs inside a sampler call,
so a test can break something while a model request is in flight.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from core.plugins import load_plugins
from core.rollout import RolloutOutcome
from core.rundir.metrics import read_metrics
from core.testing.fakes import CREATED, FakeBackend, compose, fake_backend_plugin
from core.trainer.loop import Trainer
from core.trainer.signal import StepSignal
from core.types import Datum, RolloutStatus, SampleResult, SamplingParams

HERE = Path(__file__).parent


def fault_overrides(tmp_path: Path, *extra: str, agent: str = "fault_agents:succ") -> list[str]:
    """Overrides for a small, fast run on the fake backend: 2 prompts x 2 rollouts, 3 steps,
    one agent process, no evaluation (its rollouts would take the faults), no canary.
    ``extra`` overrides win."""
    return [
        "backend=fake",
        f"run_dir={tmp_path / 'run'}",
        "trainer.max_steps=3",
        "trainer.batch_size=2",
        "trainer.group_size=2",
        "trainer.progress=false",
        "trainer.loggers=[jsonl]",
        "trainer.canary=false",
        "trainer.eval_size=0",
        "trainer.rollout_timeout_s=20",
        "runtime.num_processes=1",
        "runtime.startup_timeout_s=60",
        f"task.agent={agent}",
        f"+task.agent_env.PYTHONPATH={HERE}",
        f"+task.agent_env.FAULT_DIR={tmp_path}",
        "task.generator_kwargs.rows=40",
        *extra,
    ]


def fault_config(tmp_path: Path, *extra: str, agent: str = "fault_agents:succ") -> tuple[Any, Any]:
    """The composed config of ``fault_overrides`` and the plugins with ``backend=fake``."""
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    return compose(fault_overrides(tmp_path, *extra, agent=agent), plugins), plugins


@dataclass
class StepSeen:
    """What the loop computed in one step (read-only copies of its own objects)."""

    step: int
    outcomes: list[RolloutOutcome] = field(default_factory=list)
    signal: StepSignal | None = None


@dataclass
class LoopSpy:
    """Records each step's outcomes and the signal built from them, and the running trainer."""

    trainer: Trainer | None = None
    steps: list[StepSeen] = field(default_factory=list)
    current_step: int = 0
    """The step whose rollouts are running (1-based; 0 before the first)."""

    def install(self, monkeypatch: pytest.MonkeyPatch, run_dir: Path | None = None) -> LoopSpy:
        """Spy on every ``Trainer``, or with ``run_dir`` only on the one writing there
        (spies on concurrent trainers chain)."""
        spy = self
        rollouts, signal = Trainer._rollouts, Trainer._signal

        def mine(trainer: Trainer) -> bool:
            return run_dir is None or trainer.run_dir == run_dir

        async def spy_rollouts(trainer: Trainer) -> list[RolloutOutcome]:
            if not mine(trainer):
                return await rollouts(trainer)
            spy.trainer = trainer
            spy.current_step = trainer.step + 1
            outcomes = await rollouts(trainer)
            spy.steps.append(StepSeen(spy.current_step, list(outcomes)))
            return outcomes

        def spy_signal(trainer: Trainer, outcomes: list[RolloutOutcome]) -> StepSignal:
            built = signal(trainer, outcomes)
            if mine(trainer):
                spy.steps[-1].signal = built
            return built

        monkeypatch.setattr(Trainer, "_rollouts", spy_rollouts)
        monkeypatch.setattr(Trainer, "_signal", spy_signal)
        return self

    def step(self, n: int) -> StepSeen:
        return next(s for s in self.steps if s.step == n)


Hook = Callable[[Sequence[int], str], Awaitable[None]]


class HookedSampler:
    """A sampler that awaits ``hook(prompt, session_id)`` before each call of ``inner``."""

    def __init__(self, inner: Any, hook: Hook) -> None:
        self.inner, self.hook = inner, hook

    async def sample(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> SampleResult:
        await self.hook(prompt_token_ids, session_id)
        result: SampleResult = await self.inner.sample(prompt_token_ids, params, session_id=session_id)
        return result


def hook_sampler(
    monkeypatch: pytest.MonkeyPatch,
    hook: Hook,
    inner: Callable[[FakeBackend, int], Any] | None = None,
) -> None:
    """Make every sampler the fake backend hands the gateway (initially and after each
    weight sync) a ``HookedSampler`` around its own (or around ``inner(backend, seed)``)."""
    original = FakeBackend._new_sampler

    def new_sampler(backend: FakeBackend, seed: int) -> Any:
        wrapped = inner(backend, seed) if inner is not None else original(backend, seed)
        return HookedSampler(wrapped, hook)

    monkeypatch.setattr(FakeBackend, "_new_sampler", new_sampler)


def run_loop(cfg: Any, plugins: Any) -> tuple[int, FakeBackend]:
    """Run the training loop to its end; its exit code and the fake backend it used."""
    CREATED.clear()
    code = asyncio.run(Trainer(cfg, plugins).run())
    return code, CREATED[-1]


def step_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The per-step metric records of a run, by step."""
    return {int(r["step"]): r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r}


def statuses(outcomes: Sequence[RolloutOutcome]) -> list[str]:
    return sorted(o.result.status.value for o in outcomes)


def assert_metrics_match(record: dict[str, Any], outcomes: Sequence[RolloutOutcome]) -> None:
    """The step's ``rollouts/<status>`` counts are exactly the statuses its rollouts got."""
    assert record["rollouts/total"] == len(outcomes)
    for status in RolloutStatus:
        want = sum(1 for o in outcomes if o.result.status is status)
        assert record[f"rollouts/{status.value}"] == want, (status.value, record)
    assert record["rollouts/failed"] == sum(1 for o in outcomes if not o.ok)


def assert_trained_only_ok(spy: LoopSpy, backend: FakeBackend) -> list[Datum]:
    """Nothing from a failed rollout reached ``forward_backward``.

    Each ``forward_backward`` call is matched to the step that made it: its datums
    are exactly that step's signal, every datum comes from an ``ok`` rollout's row,
    and no failed rollout's row (a broken turn) is among them. Returns every datum sent.
    """
    trained = [s for s in spy.steps if s.signal is not None and s.signal.has_signal]
    assert len(backend.datums_seen) == len(trained), "one forward_backward per step with signal"
    sent: list[Datum] = []
    for seen, datums in zip(trained, backend.datums_seen, strict=True):
        assert seen.signal is not None
        assert datums == seen.signal.datums
        by_id = {o.request.rollout_id: o for o in seen.outcomes}
        for rollout_id, _row in seen.signal.sources:
            assert by_id[rollout_id].ok, by_id[rollout_id].result
        failed_ids = {o.request.rollout_id for o in seen.outcomes if not o.ok}
        assert not failed_ids & {rid for rid, _ in seen.signal.sources}
        for d in datums:
            assert all(math.isfinite(a) for a in d.advantages), d.advantages
        sent.extend(datums)
    return sent

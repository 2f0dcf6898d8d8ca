"""The inference server killed with SIGKILL in the middle of a training step.

The gateway's sampler is tracerl's vLLM HTTP sampler pointed at the real local
inference server (``python -m tracerl_local.serve``, the tiny model) started as a
subprocess; everything else is the usual real stack with the recording
``FakeBackend`` (whose tokenizer is the server's). The agent swallows the
gateway's 503 and returns a reward anyway, so the loop, not the agent, has to
notice the broken turns: those rollouts become ``sampler_error``, none of their
tokens train, and the step's failure rate decides between going on and aborting
(two runs with different ``trainer.max_failure_rate`` share one server and its kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from core.errors import RunAborted
from core.samplers import HttpSamplerConfig, build_http_sampler
from core.testing.fakes import FakeBackend
from core.trainer.loop import Trainer
from core.types import RolloutStatus
from tests.faults.harness import (
    HookedSampler,
    LoopSpy,
    assert_metrics_match,
    assert_trained_only_ok,
    fault_config,
    statuses,
    step_records,
)

pytestmark = pytest.mark.integration


class Server:
    """A ``python -m tracerl_local.serve`` subprocess (tiny model, seed 0, a free port).
    Requests wait ``--batch-wait-ms`` 300 in its batch queue: time to kill it under them."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracerl_local.serve", "--port", "0", "--seed", "0",
             "--batch-wait-ms", "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = ""

    def wait_ready(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else "no output"
        self.url = json.loads(line)["url"]
        return self.url

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.proc.communicate(timeout=30)


@pytest.fixture
def server() -> Iterator[Server]:
    started = Server()
    try:
        started.wait_ready()
        yield started
    finally:
        started.close()


def _config(tmp_path: Path, max_failure_rate: float) -> tuple[Any, Any]:
    return fault_config(
        tmp_path,
        "trainer.batch_size=2",
        "trainer.group_size=3",
        f"trainer.max_failure_rate={max_failure_rate}",
        agent="fault_agents:swallowing",
    )


def _assert_broken_rollouts_are_sampler_errors(spy: LoopSpy) -> int:
    """Every non-ok rollout is ``sampler_error`` with a failed call in its session."""
    broken = 0
    for seen in spy.steps:
        for o in seen.outcomes:
            if o.ok:
                assert o.faults["sampler_errors"] == 0
                continue
            assert o.result.status is RolloutStatus.SAMPLER_ERROR, o.result
            assert o.faults["sampler_errors"] >= 1 and "sampler_errors=" in (o.result.error or "")
            assert o.result.reward is None and all(r.reward is None for r in o.rows)
            broken += 1
    return broken


def test_killed_server_mid_step_gives_sampler_errors_and_the_threshold_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: Server
) -> None:
    """Two runs at once against one server (starting one costs seconds of CPU):
    ``max_failure_rate=1.0`` and ``0.1``. Each holds the first model call of its step 2
    until both runs are in step 2; then the server is SIGKILLed 50 ms after the held
    calls go out (they wait in its batch queue)."""
    runs = {"on": 1.0, "abort": 0.1}
    spies = {name: LoopSpy().install(monkeypatch, run_dir=tmp_path / name / "run") for name in runs}
    samplers: dict[int, Any] = {}
    entered: set[str] = set()
    both_in_step_2 = asyncio.Event()

    def spy_of(backend: FakeBackend) -> tuple[str, LoopSpy]:
        return next((n, s) for n, s in spies.items() if s.trainer is not None and s.trainer.backend is backend)

    async def hold_then_kill(backend: FakeBackend, prompt: Sequence[int], session_id: str) -> None:
        name, spy = spy_of(backend)
        if spy.current_step != 2 or name in entered:
            return
        entered.add(name)
        if len(entered) == len(runs):
            asyncio.get_running_loop().call_later(0.05, server.kill)
            both_in_step_2.set()
        else:
            with contextlib.suppress(TimeoutError):  # the other run failed before step 2
                await asyncio.wait_for(both_in_step_2.wait(), 30)

    def new_sampler(backend: FakeBackend, seed: int) -> HookedSampler:
        if id(backend) not in samplers:  # built in the loop that uses it, kept across versions
            samplers[id(backend)] = build_http_sampler(
                HttpSamplerConfig(
                    kind="vllm",
                    urls=[server.url],
                    connect_retries=1,
                    retry_backoff_s=0.01,
                    connect_timeout_s=2.0,
                    request_timeout_s=30.0,
                    health_interval_s=0,
                )
            )
        return HookedSampler(samplers[id(backend)], functools.partial(hold_then_kill, backend))

    close = FakeBackend.aclose

    async def aclose(backend: FakeBackend) -> None:
        await samplers[id(backend)].aclose()
        await close(backend)

    monkeypatch.setattr(FakeBackend, "_new_sampler", new_sampler)
    monkeypatch.setattr(FakeBackend, "aclose", aclose)
    configs = {name: _config(tmp_path / name, rate) for name, rate in runs.items()}

    async def both() -> list[Any]:
        return await asyncio.gather(
            *(Trainer(cfg, plugins).run() for cfg, plugins in configs.values()), return_exceptions=True
        )

    went_on, aborted = asyncio.run(both())
    assert entered == set(runs) and server.proc.poll() is not None

    # max_failure_rate=1.0: the run goes on to its end, the dead server failing every call
    spy = spies["on"]
    assert went_on == 0
    assert statuses(spy.step(1).outcomes) == ["ok"] * 6, "the server answered before the kill"
    assert "sampler_error" in statuses(spy.step(2).outcomes)
    assert statuses(spy.step(3).outcomes) == ["sampler_error"] * 6, "the server stays dead"
    broken = _assert_broken_rollouts_are_sampler_errors(spy)
    records = step_records(tmp_path / "on" / "run")
    assert sorted(records) == [1, 2, 3]
    for n in (1, 2, 3):
        assert_metrics_match(records[n], spy.step(n).outcomes)
    assert sum(r["rollouts/sampler_error"] for r in records.values()) == broken
    assert records[3]["faults/sampler_errors"] >= 6 and records[3]["train/skipped"] == 1.0
    assert spy.trainer is not None
    assert assert_trained_only_ok(spy, spy.trainer.backend), "step 1 trained on the server's tokens"

    # max_failure_rate=0.1: step 2 (at least its held call broken) aborts, naming why
    spy = spies["abort"]
    assert isinstance(aborted, RunAborted), aborted
    message = str(aborted)
    assert [s.step for s in spy.steps] == [1, 2]
    assert statuses(spy.step(1).outcomes) == ["ok"] * 6
    assert "step 2:" in message and "trainer.max_failure_rate=0.1" in message
    assert "'sampler_error'" in message and "sampler_errors=" in message
    assert _assert_broken_rollouts_are_sampler_errors(spy) >= 1
    # the aborted step logged and trained nothing; step 1 did both
    assert sorted(step_records(tmp_path / "abort" / "run")) == [1]
    assert spy.steps[-1].signal is None
    assert spy.trainer is not None
    assert_trained_only_ok(spy, spy.trainer.backend)

"""The inference server killed with SIGKILL in the middle of a training step.

The gateway's sampler is tracerl's vLLM HTTP sampler pointed at the real local
inference server (``python -m tracerl_local.serve``, the tiny model) started as a
subprocess; everything else is the usual real stack with the recording
``FakeBackend`` (whose tokenizer is the server's). The agent swallows the
gateway's 503 and returns a reward anyway, so the loop, not the agent, has to
notice the broken turns: those rollouts become ``sampler_error``, none of their
tokens train, and the step's failure rate decides between going on and aborting.
"""

from __future__ import annotations

import asyncio
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
from core.testing.fakes import CREATED, FakeBackend
from core.trainer.loop import Trainer
from core.types import RolloutStatus
from tests.faults.harness import (
    LoopSpy,
    assert_metrics_match,
    assert_trained_only_ok,
    fault_config,
    hook_sampler,
    run_loop,
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


@pytest.fixture(scope="module")
def servers() -> Iterator[list[Server]]:
    """Two servers, one per test, started together (each takes seconds to import torch)."""
    started = [Server(), Server()]
    try:
        for s in started:
            s.wait_ready()
        yield started
    finally:
        for s in started:
            s.close()


def _install(monkeypatch: pytest.MonkeyPatch, spy: LoopSpy, server: Server) -> dict[str, Any]:
    """The gateway samples from ``server`` through a vLLM HTTP sampler; the first model
    call of step 2 has the server SIGKILLed 50 ms after it went out (it is then waiting
    in the server's batch queue, with the step's other calls)."""
    state: dict[str, Any] = {"killed": False, "sampler": None}

    def http_sampler(backend: FakeBackend, seed: int) -> Any:
        if state["sampler"] is None:  # built in the loop that uses it, shared by every version
            state["sampler"] = build_http_sampler(
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
        return state["sampler"]

    async def kill_during_step_2(prompt: Sequence[int], session_id: str) -> None:
        if spy.current_step == 2 and not state["killed"]:
            state["killed"] = True
            asyncio.get_running_loop().call_later(0.05, server.kill)

    close = FakeBackend.aclose

    async def aclose(backend: FakeBackend) -> None:
        if state["sampler"] is not None:
            await state["sampler"].aclose()
        await close(backend)

    hook_sampler(monkeypatch, kill_during_step_2, inner=http_sampler)
    monkeypatch.setattr(FakeBackend, "aclose", aclose)
    return state


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


def test_killed_server_mid_step_gives_sampler_errors_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: list[Server]
) -> None:
    spy = LoopSpy().install(monkeypatch)
    state = _install(monkeypatch, spy, servers[0])
    cfg, plugins = _config(tmp_path, max_failure_rate=1.0)
    code, backend = run_loop(cfg, plugins)
    assert code == 0 and state["killed"] and servers[0].proc.poll() is not None

    assert statuses(spy.step(1).outcomes) == ["ok"] * 6, "the server answered before the kill"
    assert "sampler_error" in statuses(spy.step(2).outcomes)
    assert statuses(spy.step(3).outcomes) == ["sampler_error"] * 6, "the server stays dead"
    broken = _assert_broken_rollouts_are_sampler_errors(spy)
    records = step_records(Path(str(cfg.run_dir)))
    assert sorted(records) == [1, 2, 3]
    for n in (1, 2, 3):
        assert_metrics_match(records[n], spy.step(n).outcomes)
    assert sum(r["rollouts/sampler_error"] for r in records.values()) == broken
    assert records[3]["faults/sampler_errors"] >= 6 and records[3]["train/skipped"] == 1.0
    assert assert_trained_only_ok(spy, backend), "step 1 trained on the server's tokens"


def test_killed_server_mid_step_aborts_past_the_failure_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: list[Server]
) -> None:
    spy = LoopSpy().install(monkeypatch)
    state = _install(monkeypatch, spy, servers[1])
    cfg, plugins = _config(tmp_path, max_failure_rate=0.25)
    CREATED.clear()
    with pytest.raises(RunAborted) as info:
        asyncio.run(Trainer(cfg, plugins).run())
    assert state["killed"]
    message = str(info.value)
    aborted_at = spy.steps[-1].step
    assert aborted_at in (2, 3)
    assert f"step {aborted_at}:" in message and "trainer.max_failure_rate=0.25" in message
    assert "'sampler_error'" in message and "sampler_errors=" in message
    _assert_broken_rollouts_are_sampler_errors(spy)
    # the aborted step logged nothing and trained nothing; the steps before it did
    records = step_records(Path(str(cfg.run_dir)))
    assert sorted(records) == list(range(1, aborted_at))
    assert spy.steps[-1].signal is None
    assert_trained_only_ok(spy, CREATED[-1])

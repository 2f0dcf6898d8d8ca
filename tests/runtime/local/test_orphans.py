"""A trainer killed with SIGKILL leaves no agent processes behind, nor their children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from local_runtime_helpers import agent_env

PARENT = textwrap.dedent(
    """
    import asyncio, json, sys
    from core.runtime.local import LocalRuntime

    async def main():
        runtime = LocalRuntime(agent="core.tasks.succ_digit:app", num_processes=2)
        await runtime.start()
        print(json.dumps([p.proc.pid for p in runtime.processes]), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.integration
def test_agents_exit_when_the_trainer_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "agent processes outlived the trainer"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()


SPAWNING_PARENT = textwrap.dedent(
    """
    import asyncio, json, sys
    from core.runtime.local import LocalRuntime

    async def main():
        env = json.loads(sys.argv[1])
        runtime = LocalRuntime(agent="spawning_agent:app", num_processes=1, env=env)
        await runtime.start()
        print(json.dumps([p.proc.pid for p in runtime.processes]), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


@pytest.mark.integration
def test_children_of_agents_die_with_a_killed_trainer(tmp_path: Path) -> None:
    """The agent's own children go too: one in its process group, one that called setsid."""
    pids_file = tmp_path / "child-pids"
    env = agent_env(TRACERL_TEST_CHILD_PIDS=str(pids_file))
    parent = subprocess.Popen(
        [sys.executable, "-c", SPAWNING_PARENT, json.dumps(env)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    children: list[int] = []
    try:
        assert parent.stdout is not None
        agents = json.loads(parent.stdout.readline())
        children = [int(p) for p in pids_file.read_text().split()]
        assert len(children) == 2 and all(_alive(p) for p in [*agents, *children])
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        everything = [*agents, *children]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in everything):
            time.sleep(0.2)
        left = [p for p in everything if _alive(p)]
        assert not left, (
            f"processes outlived the trainer: {left} (agents {agents}, children {children})"
        )
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()

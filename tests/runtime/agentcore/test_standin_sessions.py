"""The stand-in ends sessions nobody stopped, so agent processes never pile up.

A trainer's StopRuntimeSession can be lost (throttled past its deadline, or an
invoke can arrive after its session's stop and open a new one); AgentCore then
ends the session after its idle timeout unless the agent's ``/ping`` says
``HealthyBusy``, and caps the sessions alive at once. The stand-in must do the
same, or one process per forgotten session stays alive until it is stopped.
Real agent processes (``acr_test_agents``), the real boto3 client.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from acr_helpers import CREDS, agent_env
from botocore.config import Config
from botocore.exceptions import ClientError

from core.agent._protocol import ENVELOPE_KEY, PROTOCOL_VERSION
from core.testing.agentcore_standin import EXAMPLE_ARN, AcrStandIn, StandInServer
from core.testing.agentcore_standin.__main__ import train_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _client(url: str) -> Any:
    return boto3.client(
        "bedrock-agentcore",
        endpoint_url=url,
        region_name="us-west-2",
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
        config=Config(retries={"total_max_attempts": 1}),
    )


def _invoke(client: Any, session: str, payload: dict[str, Any]) -> dict[str, Any]:
    response = client.invoke_agent_runtime(
        agentRuntimeArn=EXAMPLE_ARN,
        runtimeSessionId=session,
        payload=json.dumps(payload).encode(),
        contentType="application/json",
        accept="application/json",
    )
    return dict(json.loads(response["response"].read()))


def _start(payload: dict[str, Any], *, background: bool) -> dict[str, Any]:
    """The payload wrapped in a start envelope (answered at once, or when the handler is done)."""
    envelope = {"version": PROTOCOL_VERSION, "operation": "start", "invocation_id": "i1"}
    return {**payload, ENVELOPE_KEY: {**envelope, "background": background}}


def _pid(standin: AcrStandIn, session: str) -> int:
    proc = standin.sessions[session].proc
    assert proc is not None and proc.proc is not None
    return int(proc.proc.pid)


def _alive_agents(standin: AcrStandIn) -> int:
    return sum(1 for s in standin.sessions.values() if s.proc is not None and s.proc.alive())


def _wait(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_unstopped_sessions_end_when_idle_and_busy_ones_stay(tmp_path: Path) -> None:
    standin = AcrStandIn(
        agent="acr_test_agents:app",
        env=agent_env(),
        workdir=tmp_path,
        idle_timeout_s=2.0,
        max_sessions=2,
    )
    done, busy, third = (f"sess-{name}-{'x' * 30}" for name in ("done", "busy", "third"))
    with StandInServer(standin) as server:
        client = _client(server.url)
        base = {"_config": {"base_url": "http://127.0.0.1:9/v1", "model_id": "m", "api_key": "k"}}
        # A background job (as on the S3 channel): no invocation in flight, agent HealthyBusy.
        reply = _invoke(client, busy, _start({**base, "sleep_s": 10.0}, background=True))
        assert reply["status"] == "in_progress"
        pids = {busy: _pid(standin, busy)}
        # A finished rollout whose stop never comes.
        assert _invoke(client, done, _start(base, background=False))["result"]["reward"] == 1.0
        pids[done] = _pid(standin, done)
        assert _alive_agents(standin) == 2
        # The cap: a third session is refused while two are alive.
        with pytest.raises(ClientError) as info:
            _invoke(client, third, _start(base, background=False))
        assert info.value.response["Error"]["Code"] == "ServiceQuotaExceededException"
        assert _alive_agents(standin) == 2
        # The finished one goes after the idle timeout; the busy one stays while it works.
        assert _wait(lambda: done in standin.reaped, 6.0), standin.reaped
        assert busy in standin.sessions and busy not in standin.reaped
        assert _wait(lambda: busy in standin.reaped, 15.0), standin.reaped
        assert standin.stopped_sessions() == []  # nobody called StopRuntimeSession
        assert standin.sessions == {}
        for pid in pids.values():  # the processes are gone, not only forgotten
            assert _wait(lambda pid=pid: not _pid_alive(pid), 5.0), pid
        # Room again: the third session now gets an agent.
        assert _invoke(client, third, _start(base, background=False))["result"]["reward"] == 1.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped yet) is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_the_printed_train_command_carries_dummy_credentials_and_a_small_batch() -> None:
    """What `python -m core.testing.agentcore_standin` prints (and docs/agentcore.md quotes) runs
    without AWS credentials and with a batch the stand-in serves."""
    command = train_command("http://127.0.0.1:9000")
    assert command.startswith("AWS_ACCESS_KEY_ID=standin AWS_SECRET_ACCESS_KEY=standin python -m core.train")
    assert "trainer.batch_size=2 trainer.group_size=4 runtime.max_concurrency=8" in command
    docs = (Path(__file__).parents[3] / "docs" / "agentcore.md").read_text()
    assert train_command("http://127.0.0.1:9000") in " ".join(docs.replace("\\\n", " ").split())

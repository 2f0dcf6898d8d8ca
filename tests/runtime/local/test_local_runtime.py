"""The local runtime against real agent server processes (no gateway needed: the
test agents only read their model config and answer with a reward)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from local_runtime_helpers import agent_env, make_request
from omegaconf import OmegaConf

from core.agent import TOKEN_HEADER
from core.errors import ConfigError, RuntimeStartError
from core.runtime.config import LocalRuntimeConfig
from core.runtime.local import LocalRuntime
from core.types import RolloutStatus

pytestmark = pytest.mark.integration


def run_with(
    body: Callable[[LocalRuntime], Awaitable[None]],
    agent: str = "tracerl_test_agents:app",
    env_extra: dict[str, str] | None = None,
    **kw: Any,
) -> None:
    async def main() -> None:
        rt = LocalRuntime(agent, env=agent_env(**(env_extra or {})), **{"num_processes": 2, **kw})
        await rt.start()
        try:
            await body(rt)
        finally:
            await rt.aclose()

    asyncio.run(main())


def test_rollouts_collect_rewards_config_and_separate_workdirs() -> None:
    async def body(rt: LocalRuntime) -> None:
        reqs = [make_request({"reward": i / 10, "note": f"n{i}"}) for i in range(16)]
        results = await asyncio.gather(*(rt.run_rollout(r) for r in reqs))
        assert [r.status for r in results] == [RolloutStatus.OK] * 16
        assert [r.reward for r in results] == [i / 10 for i in range(16)]
        assert [r.rollout_id for r in results] == [r.rollout_id for r in reqs]
        pids = {r.metrics["pid"] for r in results}
        assert len(pids) == 2, "both processes should serve"
        assert {p.pid for p in rt.processes} == {int(p) for p in pids}
        assert all(r.metrics["api_key_len"] == len(reqs[0].session_id) for r in results)
        assert all(p.in_flight == 0 for p in rt.processes)
        assert rt.root is not None
        assert not any((rt.root / "sessions").iterdir()), "session dirs are removed after rollouts"

    run_with(body)


def test_payload_carries_model_config_and_session_workdir(tmp_path: Any) -> None:
    """The echo reveals what the agent received: _config with api_key = session id."""

    async def body(rt: LocalRuntime) -> None:
        from core.runtime import _channels

        req = make_request(
            {"reward": 1.0}, session_id="sess-abc", sampling_params={"temperature": 0.3}
        )
        inv = await rt._invocation(req)  # the same path run_rollout takes
        try:
            output = await rt._channel.run(inv)  # type: ignore[union-attr]
        finally:
            inv.proc.in_flight -= 1
        assert isinstance(rt._channel, _channels.HttpChannel)
        echo = output["echo"]
        assert echo["api_key"] == "sess-abc" and echo["session"] == "sess-abc"
        assert echo["base_url"] == req.base_url and echo["sampling"] == {"temperature": 0.3}
        assert echo["workdir"] == str(tmp_path / "sessions" / "sess-abc")
        assert (tmp_path / "sessions" / "sess-abc" / "note.txt").exists()

    run_with(body, workdir=str(tmp_path), num_processes=1)


def test_fault_handler_raises_gives_crashed_with_traceback() -> None:
    async def body(rt: LocalRuntime) -> None:
        bad, good = await asyncio.gather(
            rt.run_rollout(make_request({"mode": "raise", "tag": "T42"})),
            rt.run_rollout(make_request({"reward": 0.5})),
        )
        assert bad.status is RolloutStatus.CRASHED
        assert "Traceback" in (bad.error or "") and "agent bug on purpose: T42" in (bad.error or "")
        assert good.status is RolloutStatus.OK and good.reward == 0.5

    run_with(body)


def test_fault_hang_past_timeout_is_cancelled_and_others_go_on() -> None:
    async def body(rt: LocalRuntime) -> None:
        t0 = time.monotonic()
        hung, ok = await asyncio.gather(
            rt.run_rollout(make_request({"mode": "hang"}, timeout_s=1.0)),
            rt.run_rollout(make_request({"reward": 1.0, "sleep_s": 0.2})),
        )
        assert hung.status is RolloutStatus.TIMEOUT and "1s timeout" in (hung.error or "")
        assert 0.9 < hung.elapsed_s < 5 and time.monotonic() - t0 < 8
        assert ok.status is RolloutStatus.OK
        # The hung handler was cancelled inside the agent: nothing is left busy.
        for _ in range(50):
            if all(p.in_flight == 0 for p in rt.processes):
                break
            await asyncio.sleep(0.05)
        import httpx

        async with httpx.AsyncClient() as client:
            pings = [
                (await client.get(f"{p.base_url}/ping")).json()["status"] for p in rt.processes
            ]
        assert pings == ["Healthy", "Healthy"]
        after = await rt.run_rollout(make_request({"reward": 0.25}))
        assert after.status is RolloutStatus.OK and after.reward == 0.25

    run_with(body)


def test_fault_process_killed_mid_rollout_is_crashed_then_restarted() -> None:
    async def body(rt: LocalRuntime) -> None:
        victim = rt.processes[0]
        old_pid = victim.pid
        long = [
            asyncio.create_task(rt.run_rollout(make_request({"reward": 1.0, "sleep_s": 3.0})))
            for _ in range(6)
        ]
        await asyncio.sleep(0.8)
        assert victim.in_flight > 0
        victim.kill()
        results = await asyncio.gather(*long)
        crashed = [r for r in results if r.status is RolloutStatus.CRASHED]
        ok = [r for r in results if r.status is RolloutStatus.OK]
        assert crashed and ok, [r.status for r in results]
        assert all(
            "mid-rollout" in (r.error or "") or "lost the invocation" in (r.error or "")
            for r in crashed
        )
        # The pool restarts the dead process and keeps serving.
        later = await asyncio.gather(
            *(rt.run_rollout(make_request({"reward": 0.5})) for _ in range(8))
        )
        assert all(r.status is RolloutStatus.OK for r in later)
        for _ in range(100):
            if victim.healthy:
                break
            await asyncio.sleep(0.05)
        assert victim.healthy and victim.pid != old_pid and victim.restarts == 1

    run_with(body)


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        ({"mode": "no_reward"}, RolloutStatus.NO_REWARD, "has no 'reward'"),
        ({"mode": "rewards_list", "value": []}, RolloutStatus.NO_REWARD, "empty list"),
        ({"mode": "bad_reward", "value": "1.0"}, RolloutStatus.INVALID_REWARD, "'1.0'"),
        ({"mode": "bad_reward", "value": None}, RolloutStatus.NO_REWARD, "null"),
        ({"mode": "bad_reward", "value": True}, RolloutStatus.INVALID_REWARD, "True"),
        ({"mode": "bad_reward", "value": {"a": 1}}, RolloutStatus.INVALID_REWARD, "finite number"),
        ({"mode": "rewards_list", "value": [1.0, "x"]}, RolloutStatus.INVALID_REWARD, "'x'"),
    ],
)
def test_fault_reward_missing_or_not_a_number(
    payload: dict[str, Any], status: RolloutStatus, needle: str
) -> None:
    async def body(rt: LocalRuntime) -> None:
        bad, good = await asyncio.gather(
            rt.run_rollout(make_request(payload)), rt.run_rollout(make_request({"reward": 0.1}))
        )
        assert bad.status is status and bad.reward is None
        assert needle in (bad.error or "")
        assert good.status is RolloutStatus.OK

    run_with(body, num_processes=1)


def test_fault_nan_reward_is_invalid() -> None:
    async def body(rt: LocalRuntime) -> None:
        r = await rt.run_rollout(make_request({"mode": "bad_reward", "value": float("nan")}))
        assert r.status is RolloutStatus.INVALID_REWARD and "nan" in (r.error or "")
        ok = await rt.run_rollout(make_request({"mode": "rewards_list", "value": [0.0, 0.75]}))
        assert ok.status is RolloutStatus.OK and ok.reward == 0.75

    run_with(body, num_processes=1)


def test_fault_agent_never_listens() -> None:
    async def main() -> None:
        rt = LocalRuntime(
            "never_listens:app", env=agent_env(), num_processes=2, startup_timeout_s=2.0
        )
        t0 = time.monotonic()
        with pytest.raises(RuntimeStartError, match="did not answer GET /ping within 2s"):
            await rt.start()
        assert time.monotonic() - t0 < 10
        assert all(not p.alive() for p in rt.processes), "no process is left behind"
        req = make_request({"reward": 1.0})
        res = await rt.run_rollout(req)
        assert res.status is RolloutStatus.REJECTED and "not started" in (res.error or "")
        await rt.aclose()

    asyncio.run(main())


def test_fault_agent_import_error_is_reported_with_its_log() -> None:
    async def main() -> None:
        rt = LocalRuntime(
            "broken_import:app", env=agent_env(), num_processes=1, startup_timeout_s=30
        )
        with pytest.raises(RuntimeStartError, match="exited with code 1") as info:
            await rt.start()
        assert "needs a package that is not installed" in str(info.value)
        await rt.aclose()

    asyncio.run(main())


def test_restart_that_never_listens_leaves_the_rest_serving(tmp_path: Any) -> None:
    """Process 0 dies and its replacement hangs at import: the pool serves on process 1."""
    block = tmp_path / "block"

    async def main() -> None:
        rt = LocalRuntime(
            "tracerl_test_agents:app",
            env=agent_env(TRACERL_TEST_BLOCK_FILE=str(block)),
            num_processes=2,
            startup_timeout_s=1.5,
            max_restarts=1,
        )
        await rt.start()
        try:
            block.write_text("1")
            rt.processes[0].kill()
            results = await asyncio.gather(
                *(rt.run_rollout(make_request({"reward": 1.0})) for _ in range(10))
            )
            assert all(r.status is RolloutStatus.OK for r in results), [r.error for r in results]
            await asyncio.sleep(2.5)  # the restart gives up after startup_timeout_s
            assert not rt.processes[0].healthy and rt.processes[0].restarts == 1
            more = await asyncio.gather(
                *(rt.run_rollout(make_request({"reward": 1.0})) for _ in range(4))
            )
            assert all(r.status is RolloutStatus.OK for r in more)
        finally:
            await rt.aclose()

    asyncio.run(main())


def test_concurrency_limit_and_cancel() -> None:
    async def body(rt: LocalRuntime) -> None:
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(rt.run_rollout(make_request({"reward": 1.0, "sleep_s": 0.4})) for _ in range(6))
        )
        assert all(r.status is RolloutStatus.OK for r in results)
        assert time.monotonic() - t0 >= 1.2, "max_concurrency=2 must run 6 rollouts in 3 waves"
        # elapsed_s counts the rollout, not the wait for a slot
        assert max(r.elapsed_s for r in results) < 1.2

        req = make_request({"mode": "hang"})
        task = asyncio.create_task(rt.run_rollout(req))
        await asyncio.sleep(0.5)
        await rt.cancel(req.rollout_id)
        res = await task
        assert res.status is RolloutStatus.CRASHED and "cancelled" in (res.error or "")

    run_with(body, max_concurrency=2)


def test_sync_handler_runs_in_threads_concurrently() -> None:
    async def body(rt: LocalRuntime) -> None:
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(rt.run_rollout(make_request({"sleep_s": 0.5})) for _ in range(40))
        )
        assert all(r.status is RolloutStatus.OK and r.reward == 0.5 for r in results)
        assert time.monotonic() - t0 < 4, "sync handlers must not be serialized on a small pool"
        bad = await rt.run_rollout(make_request({"mode": "raise"}))
        assert bad.status is RolloutStatus.CRASHED and "KeyError: 'sync bug'" in (bad.error or "")

    run_with(body, agent="tracerl_test_agents:sync_app", num_processes=1)


def test_agents_get_an_allowlisted_environment_not_the_trainers(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#29: every agent inherited the trainer's whole environment (judge key, cloud and
    W&B credentials); now only the allowlist, ``runtime.pass_env`` and ``task.agent_env``."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge-secret")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LC_TEST_TRACERL", "allowlisted")
    monkeypatch.setenv("MY_TOOL_HOME", "passed-by-name")
    names = [
        "OPENAI_API_KEY",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "LC_TEST_TRACERL",
        "MY_TOOL_HOME",
        "EXPLICIT_ONE",
        "PATH",
        "TRACERL_AGENT_TOKEN",
    ]

    async def body(rt: LocalRuntime) -> None:
        inv = await rt._invocation(make_request({"mode": "env", "names": names}))
        try:
            output = await rt._channel.run(inv)  # type: ignore[union-attr]
        finally:
            inv.proc.in_flight -= 1
        seen = output["env"]
        assert seen["OPENAI_API_KEY"] is None and seen["WANDB_API_KEY"] is None
        assert seen["AWS_SECRET_ACCESS_KEY"] is None
        assert seen["LC_TEST_TRACERL"] == "allowlisted" and seen["PATH"]
        assert seen["MY_TOOL_HOME"] == "passed-by-name" and seen["EXPLICIT_ONE"] == "given"
        assert seen["TRACERL_AGENT_TOKEN"]  # the runtime's own variables are set

    run_with(
        body,
        env_extra={"EXPLICIT_ONE": "given"},
        num_processes=1,
        workdir=str(tmp_path),
        pass_env=["MY_TOOL_*"],
    )


def test_agent_environment_allowlist() -> None:
    from core.runtime._agent_env import agent_environment

    parent = {"PATH": "/bin", "LC_ALL": "C", "HF_TOKEN": "x", "GOOGLE_APPLICATION_CREDENTIALS": "/k"}
    assert agent_environment(parent) == {"PATH": "/bin", "LC_ALL": "C"}
    assert agent_environment(parent, pass_env=["HF_*"], explicit={"A": "1", "PATH": "/p"}) == {
        "PATH": "/p",
        "LC_ALL": "C",
        "HF_TOKEN": "x",
        "A": "1",
    }


def test_from_config_and_bad_settings() -> None:
    cfg = OmegaConf.create(
        {
            "runtime": OmegaConf.structured(LocalRuntimeConfig(num_processes=3, max_concurrency=7)),
            "task": {"agent": "tracerl_test_agents:app", "agent_env": {"A": 1}},
        }
    )
    rt = LocalRuntime.from_config(cfg)
    assert rt.config.num_processes == 3 and rt.config.max_concurrency == 7
    assert rt.env == {"A": "1"} and rt.agent == "tracerl_test_agents:app"
    with pytest.raises(ConfigError, match="module:attribute"):
        LocalRuntime("no_colon")
    with pytest.raises(ConfigError, match="unknown LocalRuntime settings"):
        LocalRuntime("a:b", num_procs=2)
    with pytest.raises(ConfigError, match="s3_bucket"):
        LocalRuntime("a:b", result_channel="s3")
    cfg.task.agent = ""
    with pytest.raises(ConfigError, match="task.agent is empty"):
        LocalRuntime.from_config(cfg)


def test_registered_as_the_local_runtime_plugin() -> None:
    from core.plugins import load_plugins

    plugins = load_plugins()
    spec = plugins.runtimes.get("local")
    cfg = OmegaConf.create(
        {
            "runtime": OmegaConf.structured(LocalRuntimeConfig()),
            "task": {"agent": "m:app", "agent_env": {}},
        }
    )
    assert isinstance(spec.factory(cfg), LocalRuntime)


def test_agents_listen_on_loopback_and_demand_the_runtime_token() -> None:
    """Pool processes refuse invocations without their token; the runtime's own rollouts pass."""

    async def body(rt: LocalRuntime) -> None:
        proc = rt.processes[0]
        assert proc.host == "127.0.0.1"
        payload = {"mode": "ok", "_config": {"base_url": "http://127.0.0.1:9/v1"}}
        async with httpx.AsyncClient(trust_env=False) as client:
            r = await client.post(f"{proc.base_url}/invocations", json=payload)
            assert r.status_code == 401 and TOKEN_HEADER in r.text
            assert (await client.get(f"{proc.base_url}/ping")).status_code == 200
        tokens = {p.token for p in rt.processes}
        assert len(tokens) == 2 and all(len(t) >= 32 for t in tokens), "one fresh token per process"
        res = await rt.run_rollout(make_request({"reward": 0.25}))
        assert res.status is RolloutStatus.OK and res.reward == 0.25

    run_with(body)


def test_stuck_sync_handlers_get_their_process_recycled() -> None:
    """A real agent process whose sync handlers hang: two threads, both taken for good.

    Once a hung rollout has timed out and the pool is full, the runtime replaces
    the process: the other hung rollout and the one queued behind them fail
    ``crashed`` saying why, and the next rollouts run on the fresh process.
    Before, every later rollout waited for a thread until its own timeout.
    """

    async def body(rt: LocalRuntime) -> None:
        proc = rt.processes[0]
        old_pid = proc.pid
        short = make_request({"mode": "hang"}, timeout_s=1.0)
        long = make_request({"mode": "hang"}, timeout_s=30.0)
        hung = [asyncio.create_task(rt.run_rollout(r)) for r in (short, long)]
        await asyncio.sleep(0.3)
        queued = asyncio.create_task(rt.run_rollout(make_request({}, timeout_s=30.0)))
        t0 = time.monotonic()
        res_short, res_long = await asyncio.gather(*hung)
        res_queued = await queued
        assert time.monotonic() - t0 < 10, "the recycle must not wait for the other timeouts"
        assert res_short.status is RolloutStatus.TIMEOUT
        for res in (res_long, res_queued):
            assert res.status is RolloutStatus.CRASHED, res
            assert "recycled" in (res.error or "") and "handler threads" in (res.error or "")
        after = await asyncio.gather(*(rt.run_rollout(make_request({})) for _ in range(3)))
        assert all(r.status is RolloutStatus.OK and r.reward == 0.5 for r in after), after
        assert {r.metrics["pid"] for r in after} == {proc.pid} and proc.pid != old_pid
        assert (proc.recycles, proc.restarts) == (1, 0), "a recycle is not a crash restart"

    run_with(
        body,
        agent="tracerl_test_agents:sync_app",
        num_processes=1,
        env_extra={"TRACERL_AGENT_THREADS": "2"},
    )

"""``sampler.sleep_during_train``: the fleet's engines sleep while the trainer steps.

The servers are stand-ins for the engines' network edge (``tests/samplers/servers.py``;
no vLLM or SGLang and no GPU here) with sleep routes modelled on the real ones: vLLM's
``POST /sleep?level=N``, ``POST /wake_up`` and ``GET /is_sleeping`` (dev mode), SGLang's
``POST /release_memory_occupation`` and ``POST /resume_memory_occupation``; a sleeping
stand-in answers generate requests 503, as vLLM does. Whether an engine really frees its
GPU memory is not checked here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, RunAborted
from core.plugins import load_plugins
from core.rundir.metrics import read_metrics
from core.samplers.sleep import FleetSleeper
from core.samplers.weights import WeightPusher
from core.testing.fakes import compose
from core.trainer.loop import Trainer
from core.types import SamplingParams
from tests.samplers.servers import BackgroundLoop
from tests.samplers.test_fleet_weights import sampler_for, session_on

PARAMS = SamplingParams(max_tokens=4)
WEIGHTS = "/shared/weights/v000001"


def test_vllm_servers_sleep_and_wake_and_nothing_is_sent_while_asleep(make_standin: Any) -> None:
    standin, url = make_standin(name="v")
    sampler = sampler_for("vllm", [url])
    sleeper = FleetSleeper(WeightPusher(sampler), level=2)

    async def go() -> Any:
        await sleeper.sleep()
        assert standin.sleeping and sleeper.asleep
        held = asyncio.create_task(sampler.sample([1, 2], PARAMS, session_id="s"))
        await asyncio.sleep(0.2)
        assert not held.done() and not standin.generate_hits()  # held, not sent to the sleeping engine
        await sleeper.wake(1)
        result = await held
        await sampler.aclose()
        return result

    result = asyncio.run(go())
    assert result.token_ids == standin.tokens and not standin.asleep_hits
    calls = [h.path + ("?" + h.body["query"] if h.body.get("query") else "") for h in standin.hits if h.path != "/health"]
    assert calls == ["/sleep?level=2", "/is_sleeping", "/wake_up", "/is_sleeping", "/inference/v1/generate"]
    slept, woke = sleeper.take_times()
    assert slept > 0 and woke > 0 and sleeper.take_times() == (0.0, 0.0)


def test_sglang_servers_release_and_resume_their_memory(make_standin: Any) -> None:
    standin, url = make_standin(name="s", weight_version="0")
    sampler = sampler_for("sglang", [url])
    sleeper = FleetSleeper(WeightPusher(sampler))

    async def go() -> None:
        await sleeper.sleep()
        assert standin.sleeping
        await sleeper.wake(1)
        await sampler.aclose()

    asyncio.run(go())
    calls = [(h.path, h.body) for h in standin.hits]
    assert calls == [("/release_memory_occupation", {"query": ""}), ("/resume_memory_occupation", {"query": ""})]
    assert not standin.sleeping


def test_a_server_that_cannot_sleep_is_warned_about_once_and_keeps_serving(
    make_standin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM started without --enable-sleep-mode: the sleep fails, the run goes on with it awake."""
    off, url_off = make_standin(name="off", sleep_mode="off")
    ok, url_ok = make_standin(name="ok")
    sampler = sampler_for("vllm", [url_off, url_ok])
    sleeper = FleetSleeper(WeightPusher(sampler))

    async def go() -> Any:
        for _ in range(2):
            await sleeper.sleep()
            assert [s.url for s in sleeper.asleep] == [url_ok]
            await sleeper.wake(1)
        result = await sampler.sample([1], PARAMS, session_id=session_on(sampler, url_off))
        await sampler.aclose()
        return result

    asyncio.run(go())
    err = capsys.readouterr().err
    assert err.count(f"vLLM server {url_off} did not go to sleep") == 1
    assert "--enable-sleep-mode" in err and "may run out of it" in err
    assert len(off.generate_hits()) == 1 and not off.asleep_hits  # still in rotation, awake
    assert [h.path for h in ok.hits].count("/wake_up") == 2 and [h.path for h in off.hits].count("/wake_up") == 0


def test_a_server_that_fails_to_wake_is_retired_and_the_push_goes_to_the_others(
    make_standin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    stuck, url_stuck = make_standin(name="stuck", sleep_mode="no_wake")
    good, url_good = make_standin(name="good")
    sampler = sampler_for("vllm", [url_stuck, url_good])
    pusher = WeightPusher(sampler)
    sleeper = FleetSleeper(pusher)

    async def go() -> Any:
        await sleeper.sleep()
        await sleeper.wake(1)
        report = await pusher.push(WEIGHTS, 1)
        results = [await sampler.sample([1], PARAMS, session_id=f"s{i}") for i in range(4)]
        await sampler.aclose()
        return report, results

    report, results = asyncio.run(go())
    assert report.updated == [url_good]
    assert [s.url for s in sampler.pool.retired] == [url_stuck] and not stuck.generate_hits()
    assert len(good.generate_hits()) == 4
    err = capsys.readouterr().err
    assert f"vLLM server {url_stuck} failed to wake up for the weight update to version 1" in err
    assert "POST /wake_up answered HTTP 500" in err


def test_when_no_server_wakes_the_push_aborts_naming_the_reason(make_standin: Any) -> None:
    _, url = make_standin(name="stuck", weight_version="0", sleep_mode="no_wake")
    sampler = sampler_for("sglang", [url])
    pusher = WeightPusher(sampler)
    sleeper = FleetSleeper(pusher)

    async def go() -> None:
        await sleeper.sleep()
        await sleeper.wake(1)
        try:
            await pusher.push(WEIGHTS, 1)
        finally:
            await sampler.aclose()

    with pytest.raises(RunAborted, match=r"no inference server is left.*POST /resume_memory_occupation answered HTTP 500"):
        asyncio.run(go())


# -- the loop -------------------------------------------------------------------------------


def _compose(tmp_path: Path, *extra: str) -> Any:
    plugins = load_plugins()
    return compose(
        [f"run_dir={tmp_path / 'run'}", "trainer.progress=false", "trainer.loggers=[jsonl]", *extra], plugins
    ), plugins


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["sampler=vllm", "sampler.urls=[http://127.0.0.1:9]", "trainer.mode=async"],
         r"in trainer.mode='async' the servers sample while the trainer trains"),
        ([], r"sampler=backend has no inference servers to put to sleep"),
    ],
)
def test_sleeping_is_refused_where_it_cannot_work(tmp_path: Path, extra: list[str], why: str) -> None:
    cfg, plugins = _compose(tmp_path, *extra, "sampler.sleep_during_train=true")
    with pytest.raises(ConfigError, match=f"sampler.sleep_during_train=true: {why}"):
        Trainer(cfg, plugins)
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_a_bad_sleep_level_names_the_key(tmp_path: Path) -> None:
    cfg, plugins = _compose(
        tmp_path, "sampler=vllm", "sampler.urls=[http://127.0.0.1:9]",
        "sampler.sleep_during_train=true", "sampler.sleep_level=3",
    )
    with pytest.raises(ConfigError, match=r"sampler.sleep_level must be 1 or 2, got 3"):
        asyncio.run(Trainer(cfg, plugins).run())


def test_a_sync_run_sleeps_the_fleet_before_each_step_and_wakes_it_before_the_push(
    tmp_path: Path, make_standin: Any, bg: BackgroundLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in forwards generate requests to the real local inference server (the run's
    model); the events log interleaves its calls with the trainer's optimizer steps."""
    from tracerl_local.backend import LocalBackend
    from tracerl_local.serve import InferenceServer

    small = (
        "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=2", "trainer.eval_every=0",
        "trainer.save_every=0", "runtime.num_processes=1", "task.generator_kwargs.rows=20",
    )
    cfg, _ = _compose(tmp_path, *small)
    model = LocalBackend.from_config(cfg, node=cfg.backend)
    server = InferenceServer(model, model_name="tiny")
    bg.run(server.start())
    events: list[str] = []
    standin, url = make_standin(name="v", upstream=server.url, events=events)
    train = Trainer._train

    async def recorded(self: Trainer, datums: Any, *rest: Any) -> dict[str, float]:
        events.append("train")
        return await train(self, datums, *rest)

    monkeypatch.setattr(Trainer, "_train", recorded)
    cfg, plugins = _compose(
        tmp_path, *small,
        "algorithm.loss_config.entropy_coef=0.01",  # every step trains, whatever the rewards
        "sampler=vllm", f"sampler.urls=[{url}]", "sampler.logprob_probe=false",
        "sampler.health_interval_s=0", "sampler.sleep_during_train=true",
    )
    try:
        assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    finally:
        bg.run(server.stop())
        bg.run(model.aclose())
    assert not standin.asleep_hits and not standin.sleeping
    calls = [e.removeprefix("v:") for e in events]
    compact = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]  # runs of one call as one
    step = ["/inference/v1/generate", "/sleep", "train", "/wake_up", "/collective_rpc"]
    assert compact == ["/collective_rpc", *step, *step, "/inference/v1/generate"], compact
    records = [r for r in read_metrics(Path(cfg.run_dir) / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["time/sampler_sleep_s"] > 0 and r["time/sampler_wake_s"] > 0 for r in records)

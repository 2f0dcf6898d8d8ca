"""``sampler=vllm|sglang``: the core loop samples from inference servers while the backend trains.

The servers are the real local inference server (``tracerl_local.serve``),
built from the run's own config so they start from the same tiny model; the
loop pushes weights to them through the engines' update endpoints after every
step. The cheap tests check the config node and the refusals; the runs
(marker ``long``) train through the servers end to end.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from omegaconf import OmegaConf

from core.errors import ConfigError, RunAborted
from core.plugins import load_plugins
from core.rundir.metrics import read_metrics
from core.testing.fakes import compose, fake_backend_plugin
from core.train import check_driving_settings
from core.trainer.fleet import SamplerConfig, build_fleet, sampler_config
from core.trainer.loop import Trainer
from tests.samplers.servers import BackgroundLoop

HERE = Path(__file__).parent
LEARN_STEPS = 250
WINDOW = 10


def _compose(tmp_path: Path, *extra: str, plugins: Any = None) -> Any:
    plugins = plugins or load_plugins()
    return compose(
        [
            f"run_dir={tmp_path / 'run'}",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            *extra,
        ],
        plugins,
    ), plugins


def test_sampler_defaults_to_the_backend_and_takes_a_fleet(tmp_path: Path) -> None:
    cfg, plugins = _compose(tmp_path)
    assert cfg.sampler.kind == "backend"
    cfg, _ = _compose(
        tmp_path, "sampler=sglang", "sampler.urls=[http://10.0.0.5:30000]", "sampler.weights_dir=/shared/w",
        plugins=plugins,
    )
    config = sampler_config(cfg.sampler)
    assert isinstance(config, SamplerConfig)
    assert (config.kind, config.urls, config.weights_dir) == ("sglang", ["http://10.0.0.5:30000"], "/shared/w")
    cfg, _ = _compose(
        tmp_path, "sampler=vllm", "sampler.urls=[http://a:8000]", "sampler.vllm_endpoint=completions",
        plugins=plugins,
    )
    assert sampler_config(cfg.sampler).vllm_endpoint == "completions"


def test_weight_push_time_is_reported_once_per_push(tmp_path: Path) -> None:
    """A step that pushed nothing (no signal, no training) reports 0 push time, not the previous
    push's again. The servers are not reached: the pusher stands in (its own tests are
    tests/samplers/test_weight_push.py); the export writes a real directory."""
    from core.samplers.weights import PushReport
    from core.trainer.fleet import Fleet

    fleet = Fleet(SamplerConfig(kind="sglang", urls=["http://127.0.0.1:9"]), tmp_path)

    class Backend:
        weight_version = 3

        async def export_weights(self, path: str) -> str:
            Path(path).mkdir(parents=True)
            return path

    async def push(path: str, version: int) -> PushReport:
        return PushReport(version=version, updated=["http://127.0.0.1:9"])

    fleet.pusher.push = push  # type: ignore[method-assign]

    async def go() -> list[float]:
        await fleet.push(Backend())
        seen = [fleet.metrics()["time/weight_push"], fleet.metrics()["time/weight_push"]]
        await fleet.aclose()
        return seen

    pushed, idle = asyncio.run(go())
    assert pushed > 0 and idle == 0.0


def test_a_fleet_without_urls_names_the_key(tmp_path: Path) -> None:
    cfg, _ = _compose(tmp_path, "sampler=sglang")

    class Backend:
        name = "local"

        async def export_weights(self, path: str) -> str:
            return path

    with pytest.raises(ConfigError, match=r"sampler\.urls is empty"):
        build_fleet(cfg, Backend(), tmp_path)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("tinker", "Tinker trains and samples on its own service"),
        ("sagemaker", "SageMaker training sessions keep the weights"),
        ("mine", "backend 'mine' has no export_weights"),
    ],
)
def test_backends_without_weights_on_disk_are_refused(tmp_path: Path, name: str, why: str) -> None:
    cfg = OmegaConf.create({"backend": {"name": name}, "sampler": {"kind": "vllm", "urls": ["http://a:1"]}})
    backend = type("B", (), {"name": name})()
    with pytest.raises(ConfigError) as err:
        build_fleet(cfg, backend, tmp_path)
    assert why in str(err.value)
    assert f"Use sampler=backend with backend={name}, or backend=local" in str(err.value)


def test_the_loop_refuses_a_fleet_for_a_backend_that_cannot_push(tmp_path: Path) -> None:
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    cfg, _ = _compose(
        tmp_path, "backend=fake", "sampler=sglang", "sampler.urls=[http://127.0.0.1:9]",
        "task.generator_kwargs.rows=20", plugins=plugins,
    )
    with pytest.raises(ConfigError, match="sampler=sglang needs the trained weights on disk"):
        asyncio.run(Trainer(cfg, plugins).run())


@pytest.mark.parametrize("backend", ["verl", "slime"])
def test_driving_backends_refuse_a_fleet(backend: str) -> None:
    cfg = OmegaConf.create(
        {"trainer": {"mode": "sync"}, "algorithm": {}, "sampler": {"kind": "sglang", "urls": ["http://a:1"]}}
    )
    with pytest.raises(ConfigError, match=rf"backend '{backend}' runs its own trainer and its own rollout engines"):
        check_driving_settings(cfg, backend)


# -- runs through real servers ------------------------------------------------------------


class Servers:
    """Local inference servers built from a run's config, in a background event loop."""

    def __init__(self) -> None:
        self.bg = BackgroundLoop()
        self.running: list[tuple[Any, Any]] = []

    def start(self, cfg: Any, **backend_overrides: Any) -> str:
        from tracerl_local.backend import LocalBackend
        from tracerl_local.serve import InferenceServer

        node = OmegaConf.merge(cfg.backend, backend_overrides)
        backend = LocalBackend.from_config(cfg, node=node)
        server = InferenceServer(backend, model_name="tiny")
        self.bg.run(server.start())
        self.running.append((server, backend))
        return server.url

    def close(self) -> None:
        for server, backend in self.running:
            self.bg.run(server.stop())
            self.bg.run(backend.aclose())
        self.bg.close()


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    yield s
    s.close()


def _turn_versions(run_dir: Path, step: int) -> set[int]:
    versions: set[int] = set()
    with gzip.open(run_dir / "traces" / f"train_{step:06d}.jsonl.gz", "rt") as f:
        for line in f:
            rollout = json.loads(line)
            for row in rollout.get("rows", []):
                versions.update(int(t[3]) for t in row["turns"])
    return versions


SMALL = ("trainer.max_steps=3", "trainer.batch_size=4", "trainer.group_size=4", "trainer.eval_every=0",
         "trainer.save_every=0", "runtime.num_processes=1", "task.generator_kwargs.rows=40")


@pytest.mark.long
def test_a_run_samples_from_the_servers_and_pushes_every_step(
    tmp_path: Path, servers: Servers, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two servers; one cannot load the trainer's weights, leaves rotation at the first push with
    a message, and the run trains on the other, whose version is each turn's."""
    cfg, plugins = _compose(tmp_path, *SMALL)
    good = servers.start(cfg)
    bad = servers.start(cfg, tiny={"hidden_size": 32})
    cfg, plugins = _compose(tmp_path, *SMALL, "sampler=sglang", f"sampler.urls=[{good},{bad}]")
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    run_dir = Path(cfg.run_dir)
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["sampler/servers"] == 1 and r["sampler/retired"] == 1 for r in records)
    for r in records:  # each step's rollouts ran on the version pushed after the step before
        assert _turn_versions(run_dir, r["step"]) == {r["step"] - 1}
        assert r["train/logprob_diff_max"] < 1e-3  # the servers' logprobs are the trainer's
    assert httpx.get(good + "/get_weight_version", timeout=10).json() == {"weight_version": "3"}
    assert httpx.get(bad + "/get_weight_version", timeout=10).json() == {"weight_version": "0"}
    err = capsys.readouterr().err
    assert f"SGLang server {bad} failed the weight update to version 0" in err
    assert sorted(p.name for p in (run_dir / "sampler_weights").iterdir()) == ["v000003"]


@pytest.mark.long
def test_an_async_run_trains_on_versions_the_server_reported(tmp_path: Path, servers: Servers) -> None:
    """trainer.mode=async: rollouts keep running on the server while the loop pushes; each step
    trains on turns whose (server-reported) version is at most max_staleness behind."""
    extra = (*SMALL, "trainer.mode=async", "trainer.max_staleness=1")
    cfg, plugins = _compose(tmp_path, *extra)
    url = servers.start(cfg)
    cfg, plugins = _compose(tmp_path, *extra, "sampler=vllm", f"sampler.urls=[{url}]")
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    run_dir = Path(cfg.run_dir)
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        versions = _turn_versions(run_dir, r["step"])
        assert versions and versions <= {r["step"] - 2, r["step"] - 1}, (r["step"], versions)
        assert r["async/staleness_max"] <= 1
    assert httpx.get(url + "/get_weight_version", timeout=10).json() == {"weight_version": "3"}


@pytest.mark.long
def test_a_resumed_run_pushes_the_restored_weights_first(tmp_path: Path, servers: Servers) -> None:
    """A fresh server (version 0, initial weights) behind a run resumed at step 2: the push before
    the first rollout loads the checkpoint's weights, so step 3 samples version 2 from it."""
    first = (*SMALL[1:], "trainer.max_steps=2", "trainer.save_every=2")
    cfg, plugins = _compose(tmp_path, *first)
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    url = servers.start(cfg)
    cfg, plugins = _compose(
        tmp_path, *SMALL, "trainer.resume=true", "sampler=sglang", f"sampler.urls=[{url}]"
    )
    assert asyncio.run(Trainer(cfg, plugins).run()) == 0
    run_dir = Path(cfg.run_dir)
    assert _turn_versions(run_dir, 3) == {2}
    record = next(r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == 3 and "reward/mean" in r)
    assert record["train/logprob_diff_max"] < 1e-3  # the server holds the trainer's restored weights
    assert httpx.get(url + "/get_weight_version", timeout=10).json() == {"weight_version": "3"}


@pytest.mark.long
def test_a_run_aborts_when_no_server_takes_the_weights(tmp_path: Path, servers: Servers) -> None:
    cfg, plugins = _compose(tmp_path, *SMALL)
    bad = servers.start(cfg, tiny={"hidden_size": 32})
    cfg, plugins = _compose(tmp_path, *SMALL, "sampler=vllm", f"sampler.urls=[{bad}]")
    with pytest.raises(RunAborted, match=r"no inference server is left: every vLLM server in sampler\.urls failed"):
        asyncio.run(Trainer(cfg, plugins).run())


@pytest.mark.long
@pytest.mark.timeout(2400)
def test_the_default_task_learns_through_an_sglang_server(tmp_path: Path) -> None:
    """``python -m tracerl_local.serve --task succ_digit`` as the fleet, ``python -m core.train
    sampler=sglang`` pointed at it: the embedded default learns as with the backend's sampler."""
    serve = subprocess.Popen(
        [sys.executable, "-m", "tracerl_local.serve", "--port", "0", "--task", "succ_digit"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stdout is not None
        url = json.loads(serve.stdout.readline())["url"]
        run_dir = tmp_path / "run"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "core.train", f"run_dir={run_dir}", "trainer.progress=false",
             "trainer.loggers=[jsonl]", f"trainer.max_steps={LEARN_STEPS}", "trainer.eval_every=0",
             "sampler=sglang", f"sampler.urls=[{url}]"],
            capture_output=True, text=True, timeout=2300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
        by_step = {int(r["step"]): r for r in records}
        final = sum(by_step[s]["reward/mean"] for s in range(LEARN_STEPS - WINDOW + 1, LEARN_STEPS + 1)) / WINDOW
        print(f"sampler=sglang: final {final:.3f} at step {LEARN_STEPS} in {time.perf_counter() - start:.0f} s")
        assert final >= 0.8
        gaps = [r["train/logprob_diff_max"] for r in records if not math.isnan(r["train/logprob_diff_max"] or math.nan)]
        assert gaps and max(gaps) < 1e-3
        assert _turn_versions(run_dir, LEARN_STEPS) == {by_step[LEARN_STEPS - 1]["weight_version"]}
        version = httpx.get(url + "/get_weight_version", timeout=10).json()["weight_version"]
        assert version == str(by_step[LEARN_STEPS]["weight_version"])
    finally:
        serve.terminate()
        serve.wait(30)
        if serve.stdout is not None:
            serve.stdout.close()

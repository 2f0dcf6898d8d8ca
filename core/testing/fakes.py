"""Test doubles for the training loop's mechanics (not for learning).

``FakeBackend`` is a driven backend whose "policy" answers one random digit
then the end-of-turn token, with the true logprob of that choice (uniform
over ten digits). It records what the loop sends it, so tests can check
datums, steps, weight syncs, checkpoints and resumes in milliseconds and
without torch. Learning itself is tested with the real local backend.
``backend.fail_every=N`` makes every Nth sampler call fail (the gateway answers
503), to test how the loop treats rollouts with broken model calls.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from core.errors import ConfigError, SamplerError
from core.interfaces import LOSS_NAMES
from core.plugins import BackendRegistry, BackendSpec, hookimpl
from core.types import (
    AdamParams,
    Datum,
    FinishReason,
    ForwardBackwardResult,
    SampleResult,
    SamplingParams,
)


class FakeSampler:
    """Answers one random digit token and EOS; logprob log(1/10) for the digit, 0 for EOS.
    With ``fail_every=N`` every Nth call raises ``SamplerError`` instead."""

    def __init__(self, tokenizer: Any, version: int, seed: int, fail_every: int = 0) -> None:
        self._digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        self._eos = int(tokenizer.eos_token_id)
        self._version = version
        self._rng = random.Random(seed)
        self._fail_every = fail_every
        self.calls = 0

    async def sample(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> SampleResult:
        self.calls += 1
        call = self.calls  # taken before the await: concurrent calls each get their own number
        await asyncio.sleep(0)
        if self._fail_every and call % self._fail_every == 0:
            raise SamplerError(f"fake sampler failure on call {call} (fail_every={self._fail_every})")
        digit = self._rng.choice(self._digits)
        tokens, logprobs = [digit, self._eos], [math.log(0.1), 0.0]
        if params.max_tokens < 2:
            return SampleResult(tokens[:1], logprobs[:1], FinishReason.LENGTH, self._version)
        return SampleResult(tokens, logprobs, FinishReason.STOP, self._version)


@dataclass
class FakeBackendConfig:
    name: str = "fake"
    seed_offset: int = 0
    fail_every: int = 0


@dataclass
class FakeBackend:
    """A driven backend that records calls instead of training."""

    tokenizer: Any
    seed: int = 0
    name: str = "fake"
    version: int = 0
    optim_steps: int = 0
    datums_seen: list[list[Datum]] = field(default_factory=list)
    closed: bool = False
    fail_every: int = 0

    def __post_init__(self) -> None:
        self._sampler = self._new_sampler(self.seed)

    def _new_sampler(self, seed: int) -> FakeSampler:
        return FakeSampler(self.tokenizer, self.version, seed, fail_every=self.fail_every)

    @classmethod
    def from_config(cls, cfg: Any) -> FakeBackend:
        from core.tokenizer import build_tiny_tokenizer

        backend = cls(
            tokenizer=build_tiny_tokenizer(),
            seed=int(cfg.seed) + int(cfg.backend.seed_offset),
            fail_every=int(cfg.backend.fail_every),
        )
        CREATED.append(backend)
        return backend

    @property
    def sampler(self) -> FakeSampler:
        return self._sampler

    @property
    def weight_version(self) -> int:
        return self.version

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def model_id(self) -> str:
        return "fake"

    async def forward_backward(
        self, datums: Sequence[Datum], loss_fn: str, loss_config: dict[str, float] | None = None
    ) -> ForwardBackwardResult:
        if loss_fn not in LOSS_NAMES:
            raise ConfigError(f"unknown loss {loss_fn!r}; use one of {LOSS_NAMES}")
        self.datums_seen.append(list(datums))
        return ForwardBackwardResult(
            metrics={"loss": 0.0, "logprob_diff/max": 0.0},
            logprobs=[list(d.logprobs) for d in datums],
        )

    async def optim_step(self, params: AdamParams) -> dict[str, float]:
        self.optim_steps += 1
        return {"grad_norm": 0.0}

    async def sync_sampler(self) -> FakeSampler:
        self.version += 1
        self._sampler = self._new_sampler(self.seed + self.version)
        return self._sampler

    async def save_state(self, path: str) -> str:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "fake.json").write_text(
            json.dumps({"version": self.version, "optim_steps": self.optim_steps})
        )
        return path

    async def load_state(self, path: str) -> None:
        state = json.loads((Path(path) / "fake.json").read_text())
        self.version, self.optim_steps = state["version"], state["optim_steps"]
        self._sampler = self._new_sampler(self.seed + self.version)

    async def aclose(self) -> None:
        self.closed = True


CREATED: list[FakeBackend] = []
"""Every FakeBackend built through the plugin, so tests can inspect them."""


def fake_backend_plugin() -> ModuleType:
    """A plugin object registering ``backend=fake`` (pass to ``load_plugins(extra_plugins=...)``)."""

    @hookimpl
    def tracerl_register_backends(registry: BackendRegistry) -> None:
        registry.add(
            BackendSpec(
                name="fake",
                kind="driven",
                factory=FakeBackend.from_config,
                config=FakeBackendConfig,
                description="records calls; for loop tests",
            )
        )

    module = ModuleType("core.testing.fakes.plugin")
    module.tracerl_register_backends = tracerl_register_backends  # type: ignore[attr-defined]
    return module


def compose(overrides: list[str], plugins: Any) -> Any:
    """Compose the training config in process, as ``python -m core.train`` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from core.config import CONFIG_MODULE, PRIMARY_CONFIG, VERSION_BASE, register_configs

    register_configs(plugins)
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=VERSION_BASE):
        cfg = hydra_compose(config_name=PRIMARY_CONFIG, overrides=overrides)
    plugins.check_config(cfg)  # unknown backend/runtime keys, '+' or not, as the CLI refuses them
    return cfg

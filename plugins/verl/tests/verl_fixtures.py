"""Shared fixtures and fakes for the verl plugin's tests (imported by conftest.py).

``FakeLLMServerClient`` stands in for verl's ``LLMServerClient`` in the unit
tier only: that client is a Ray handle to a GPU inference engine, a network
edge this machine cannot reach. It returns real ``TokenOutput`` objects.
The integration tier uses verl's real client instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

AGENTS_DIR = Path(__file__).parent / "agents"


@dataclass
class FakeLLMServerClient:
    """Scripted ``LLMServerClient.generate``: replies ``text`` (+ EOS), with logprobs.

    Each call's logprobs are ``-(k+1)/10`` for the k-th token of the reply, so a
    test can tell exactly which logprob landed where.
    """

    tokenizer: Any
    text: str = "aa"
    stop_reason: str | None = "completed"
    global_steps: int | None = 3
    with_logprobs: bool = True
    append_eos: bool = True
    calls: list[dict[str, Any]] = field(default_factory=list)

    def reply_ids(self) -> list[int]:
        ids = list(self.tokenizer.encode(self.text, add_special_tokens=False))
        if self.append_eos:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "sampling_params": dict(sampling_params),
            }
        )
        ids = self.reply_ids()[: int(sampling_params["max_tokens"])]
        extra: dict[str, Any] = {}
        if self.global_steps is not None:
            # what verl's client adds on top of the server's global_steps
            extra = {
                "global_steps": self.global_steps,
                "min_global_steps": self.global_steps,
                "max_global_steps": self.global_steps,
            }
        await asyncio.sleep(0)
        return TokenOutput(
            token_ids=ids,
            log_probs=[-(k + 1) / 10 for k in range(len(ids))] if self.with_logprobs else None,
            stop_reason=self.stop_reason,
            num_preempted=0,
            extra_fields=extra,
        )


def expected_logprobs(n: int) -> list[float]:
    return [-(k + 1) / 10 for k in range(n)]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, abs_tol=1e-6) for x, y in zip(a, b, strict=True)
    )


def verl_config(
    *, prompt_length: int = 256, response_length: int = 128, rollout_name: str = "vllm"
) -> Any:
    """The slice of verl's trainer config an agent loop reads."""
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": rollout_name,
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "calculate_log_probs": True,
                    "n": 2,
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )


def compose_tracerl(overrides: list[str]) -> Any:
    from core.plugins import load_plugins
    from core.testing.fakes import compose

    return compose(overrides, load_plugins())


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture(scope="module")
def host_loop(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, Path]]:
    """One event loop per module (the worker's persistent actor loop) and a tracerl config file.

    The agent loop's ``WorkerHost`` (gateway server + local runtime) is a process
    singleton started in this loop on first use and shut down at the end.
    """
    from tracerl_verl.agent_loop import WorkerHost

    run_dir = tmp_path_factory.mktemp("verl_unit")
    cfg = compose_tracerl(
        [
            "backend=verl",
            f"run_dir={run_dir}",
            "task.agent=verl_test_agents:app",
            f"+task.agent_env.PYTHONPATH={AGENTS_DIR}",
            "runtime.num_processes=1",
            "gateway.history_mode=tree",
            "algorithm.max_tokens=6",
            "trainer.rollout_timeout_s=60",
        ]
    )
    path = run_dir / "tracerl.yaml"
    OmegaConf.save(cfg, path, resolve=True)
    loop = asyncio.new_event_loop()
    try:
        yield loop, path
    finally:
        loop.run_until_complete(WorkerHost.shutdown())
        loop.close()


def make_loop(tokenizer: Any, client: Any, config_path: Path, **verl_kw: Any) -> Any:
    """A ``TracerlAgentLoop`` built with the arguments verl's AgentLoopWorker passes."""
    from tracerl_verl.agent_loop import TracerlAgentLoop
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    config = verl_config(**verl_kw)
    return TracerlAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=client,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        hf_model_type="qwen2",
        tracerl_config=str(config_path),
        name="tracerl_agent",
        tools=None,
    )


def verl_batch(sessions: list[tuple[str, list[Any]]]) -> tuple[Any, list[str]]:
    """verl's advantage input for ``sessions`` (``(uid, AgentLoopOutputs)`` per rollout).

    Built the way verl's v1 trainer does it: each output's ``as_dict()`` (its
    ``response_mask`` and ``rm_scores``, the reward on the last response token),
    right-padded into one ``DataProto`` with ``uid`` beside it, and one key per
    row ``{uid}_{session_id}_{index}`` (session ids count the rollouts of a uid).
    """
    import numpy as np
    import torch
    from verl.protocol import DataProto

    rows, uids, keys = [], [], []
    per_uid: dict[str, int] = {}
    for uid, outputs in sessions:
        session = per_uid.get(uid, 0)
        per_uid[uid] = session + 1
        for i, out in enumerate(outputs):
            rows.append(out.as_dict())
            uids.append(uid)
            keys.append(f"{uid}_{session}_{i}")
    width = max(len(r["response_mask"]) for r in rows)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    scores = torch.zeros(len(rows), width, dtype=torch.float32)
    for k, r in enumerate(rows):
        n = len(r["response_mask"])
        mask[k, :n] = r["response_mask"]
        scores[k, :n] = r["rm_scores"]
    data = DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "token_level_scores": scores,
            "token_level_rewards": scores,
        },
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    return data, keys


def verl_main_config(overrides: list[str]) -> Any:
    """verl's whole trainer config as the v1 trainer holds it after ``overrides`` (our translation).

    The path of ``python -m verl.trainer.main_ppo``: Hydra composes verl's own
    ``ppo_trainer`` with the overrides (``@hydra.main`` in main_ppo), Ray pickles
    the config to ``TaskRunnerV1``, whose ``run`` calls ``OmegaConf.resolve``
    and gives it to the trainer; ``trainer_base._compute_advantage`` then passes
    ``self.config.algorithm`` to the advantage call. Nothing converts it to
    verl's ``AlgoConfig`` dataclass on that path (verl 0.9.1).
    """
    import pickle

    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    config = pickle.loads(pickle.dumps(config))  # what Ray ships to TaskRunnerV1
    OmegaConf.resolve(config)
    return config


def verl_algorithm_config(overrides: list[str]) -> Any:
    """verl's ``algorithm`` node as its advantage code receives it after ``overrides``."""
    return verl_main_config(overrides).algorithm


def run_verl_advantage(data: Any, keys: list[str], algo: Any, n: int = 3) -> Any:
    """The call verl's v1 trainer makes in ``_compute_advantage`` (``trainer_base``'s name)."""
    from verl.trainer.ppo.v1 import trainer_base

    return trainer_base.compute_advantage_for_multi_trajectories(
        data,
        batch_keys=keys,
        adv_estimator=algo.adv_estimator,
        gamma=algo.gamma,
        lam=algo.lam,
        num_repeat=n,
        norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True),
        config=algo,
    )

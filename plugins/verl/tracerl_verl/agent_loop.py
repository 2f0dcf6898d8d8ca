"""tracerl's agent loop for verl: one verl trajectory = one tracerl rollout.

Defines ``TracerlAgentLoop`` (an ``AgentLoopBase`` registered through the
agent-loop YAML written by ``tracerl_verl.launch``), ``WorkerHost`` (the
per-process gateway + runtime) and ``RolloutFailed``.

verl instantiates the loop once per trajectory inside an AgentLoopWorker, a
Ray *async* actor whose event loop lives as long as the actor. So the
gateway server, its sampler and the runtime are a per-process singleton
started on first use in that loop (``WorkerHost.get``), and every
trajectory's coroutine shares them.

Per trajectory ``run``:

1. open a gateway session (sampling from verl's ``sampling_params``, which
   already carry ``val_kwargs`` during validation; per-turn ``max_tokens``
   from ``algorithm.max_tokens``; context budget prompt + response length);
2. run the agent on the row's payload through the runtime (local processes
   or AgentCore), the agent calling the gateway with the session id as key;
3. finish the session and turn its rows into ``list[AgentLoopOutput]``
   (``tracerl_verl.rows``).

A failed rollout (any status but ``ok``: timeout, crash, no or bad reward,
a failed model call (``sampler_error``), no model call, or no trainable row)
raises ``RolloutFailed`` (``rollout_outputs``, the pure part of ``run``). verl's v1 worker then marks the prompt's group
``failure``; in sync mode the group stays sampleable with the surviving
siblings' rows, so the failed rollout is *excluded* from its GRPO group
instead of being scored 0.0 (tracerl's rule), and tracerl's estimators
(``tracerl_verl.advantages``) give a group left with one rollout advantage 0.
With ``algorithm.exclude_failed=false`` a failed rollout's rows (whatever its
status) are returned scored 0.0 instead (the anchors' behaviour, opt-in, as in
core's loop); a failed rollout without rows always raises.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase

from core.errors import TracerlError
from core.types import RolloutStatus, SamplingParams
from tracerl_verl.rows import order_rows, split_row, to_agent_loop_outputs
from tracerl_verl.sampler import VerlSampler

logger = logging.getLogger("tracerl_verl.agent_loop")

AGENT_NAME = "tracerl_agent"
"""Name of the loop in the agent-loop YAML and the dataset's ``agent_name`` column."""


class RolloutFailed(TracerlError, RuntimeError):
    """A rollout produced nothing to train on; verl drops it from its group."""

    def __init__(self, message: str, *, status: str = "crashed") -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_failed, (str(self), self.status))


def _rebuild_failed(message: str, status: str) -> RolloutFailed:
    return RolloutFailed(message, status=status)


class WorkerHost:
    """The gateway, its HTTP server, the runtime and the rollout runner of one worker process."""

    _instance: WorkerHost | None = None
    _lock: asyncio.Lock | None = None

    def __init__(
        self, cfg: Any, sampler: VerlSampler, gateway: Any, server: Any, runtime: Any, runner: Any
    ) -> None:
        self.cfg = cfg
        self.sampler = sampler
        self.gateway = gateway
        self.server = server
        self.runtime = runtime
        self.runner = runner
        self.stats = {"rollouts": 0, "failed": 0}

    @classmethod
    async def get(cls, loop: TracerlAgentLoop) -> WorkerHost:
        """The process's host, started on first call (concurrent first calls share one start)."""
        if cls._instance is not None:
            cls._instance.sampler.client = loop.server_manager
            return cls._instance
        if cls._lock is None:
            cls._lock = asyncio.Lock()
        async with cls._lock:
            if cls._instance is None:
                cls._instance = await cls._start(loop)
        cls._instance.sampler.client = loop.server_manager
        return cls._instance

    @classmethod
    async def _start(cls, loop: TracerlAgentLoop) -> WorkerHost:
        from omegaconf import OmegaConf

        from core.gateway import Gateway, GatewayConfig
        from core.rollout import start_rollout_stack

        cfg = OmegaConf.load(loop.tracerl_config)
        rollout = loop.rollout_config
        gw_cfg = GatewayConfig(**OmegaConf.to_container(cfg.gateway, resolve=True))  # type: ignore[arg-type]
        gw_cfg.max_context_tokens = int(rollout.prompt_length) + int(rollout.response_length)
        eos = loop.tokenizer.eos_token_id
        sampler = VerlSampler(
            loop.server_manager,
            rollout_name=str(rollout.name),
            stop_ids=frozenset([eos] if eos is not None else []),
        )
        model_id = str(cfg.backend.model)
        gateway = Gateway(
            tokenizer=loop.tokenizer, sampler=sampler, config=gw_cfg, model_id=model_id
        )
        public = gw_cfg.public_host
        if not public and gw_cfg.host in ("0.0.0.0", "::"):
            import ray

            public = ray.util.get_node_ip_address()
        stack = await start_rollout_stack(cfg, gateway, model_id=model_id, public_host=public)
        server, runtime, runner = stack.server, stack.runtime, stack.runner
        logger.info("tracerl gateway for this verl worker at %s", server.base_url)
        return cls(cfg, sampler, gateway, server, runtime, runner)

    @classmethod
    async def shutdown(cls) -> None:
        """Stop the runtime and the gateway server (tests; verl kills workers at exit)."""
        host, cls._instance = cls._instance, None
        if host is not None:
            await host.runtime.aclose()
            await host.server.stop()


def payload_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The tracerl payload of a verl dataset row (``tracerl_payload`` JSON column)."""
    raw = kwargs.get("tracerl_payload")
    if raw is None:
        raise RolloutFailed(
            "the dataset row has no 'tracerl_payload' column; build verl data with "
            "tracerl_verl.data.write_verl_dataset (python -m core.train backend=verl does)",
            status="rejected",
        )
    value = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(value, dict):
        raise RolloutFailed(
            f"tracerl_payload must be a JSON object, got {type(value).__name__}", status="rejected"
        )
    return value


class TracerlAgentLoop(AgentLoopBase):
    """Runs one tracerl rollout per verl trajectory (see the module docstring).

    Args:
        tracerl_config: Path of the composed tracerl config (YAML) the launcher wrote.
        *args, **kwargs: verl's ``AgentLoopBase`` arguments; ``name`` and ``tools`` from
            the YAML entry and future keywords are accepted and ignored.
    """

    def __init__(
        self,
        *args: Any,
        tracerl_config: str,
        name: str | None = None,
        tools: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tracerl_config = tracerl_config

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[Any]:
        host = await WorkerHost.get(self)
        global_steps = int(kwargs.get("global_steps", 0) or 0)
        host.sampler.default_global_steps = max(host.sampler.default_global_steps, global_steps)
        if "repetition_penalty" in sampling_params:
            host.sampler.extra_params["repetition_penalty"] = sampling_params["repetition_penalty"]
        cfg = host.cfg
        sampling = SamplingParams(
            max_tokens=int(cfg.algorithm.max_tokens),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1)),
        )
        payload = payload_of(kwargs)
        group_id = str(kwargs.get("uid", "")) or "verl"
        start = time.perf_counter()
        outcome = await host.runner.run_one(payload, group_id=group_id, sampling=sampling)
        elapsed = time.perf_counter() - start
        host.stats["rollouts"] += 1
        steps = host.sampler.forget(outcome.request.session_id)
        rollout = self.rollout_config
        try:
            outputs = rollout_outputs(
                outcome,
                prompt_length=int(rollout.prompt_length),
                response_length=int(rollout.response_length),
                exclude_failed=bool(cfg.algorithm.get("exclude_failed", True)),
                min_global_steps=steps.min_global_steps if steps else global_steps,
                max_global_steps=steps.max_global_steps if steps else global_steps,
                with_logprobs=not (steps and steps.missing_logprobs),
                metrics={"generate_sequences": elapsed},
            )
        except RolloutFailed:
            host.stats["failed"] += 1
            raise
        if outcome.result.status is not RolloutStatus.OK:  # scored 0.0 (exclude_failed=false)
            host.stats["failed"] += 1
        return outputs


def rollout_outputs(
    outcome: Any,
    *,
    prompt_length: int,
    response_length: int,
    exclude_failed: bool = True,
    min_global_steps: int = 0,
    max_global_steps: int = 0,
    with_logprobs: bool = True,
    metrics: dict[str, float] | None = None,
) -> list[Any]:
    """What verl gets for one finished rollout: its ``AgentLoopOutput`` rows, or ``RolloutFailed``.

    Args:
        outcome: ``request``, ``result`` and ``rows`` of the rollout
            (``core.rollout.RolloutOutcome`` or anything shaped like it).
        prompt_length: verl's ``rollout.prompt_length``.
        response_length: verl's ``rollout.response_length``.
        exclude_failed: ``algorithm.exclude_failed``: with False a failed rollout (any
            status) that has trainable rows is scored 0.0 instead, as in core's loop.
        min_global_steps: Oldest weight version any turn used.
        max_global_steps: Newest weight version any turn used.
        with_logprobs: Attach the sampler's logprobs.
        metrics: ``AgentLoopMetrics`` fields.

    Raises:
        RolloutFailed: any status but ``ok`` (unless scored 0.0), or no trainable row;
            verl then leaves the rollout out of its group.
    """
    result = outcome.result
    rows = order_rows(
        [
            split_row(r, prompt_length=prompt_length, response_length=response_length)
            for r in outcome.rows
        ]
    )
    if result.status is not RolloutStatus.OK or not rows:
        why = (
            f"rollout {outcome.request.rollout_id} ended with status {result.status.value!r}: "
            f"{(result.error or '').strip()[-1000:]}"
            if result.status is not RolloutStatus.OK
            else f"rollout {outcome.request.rollout_id} made no trainable model call through the gateway"
        )
        if exclude_failed or not rows:
            failed = (
                result.status
                if result.status is not RolloutStatus.OK
                else RolloutStatus.NO_MODEL_CALLS
            )
            raise RolloutFailed(why, status=failed.value)
        logger.warning("%s; scored 0.0 (algorithm.exclude_failed=false)", why)
    reward = (
        float(result.reward)
        if result.status is RolloutStatus.OK and result.reward is not None
        else 0.0
    )
    return to_agent_loop_outputs(
        rows,
        reward=reward,
        min_global_steps=min_global_steps,
        max_global_steps=max_global_steps,
        with_logprobs=with_logprobs,
        metrics=metrics,
        reward_extra_info={"tracerl_rows": float(len(rows))},
    )

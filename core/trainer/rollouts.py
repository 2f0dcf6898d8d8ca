"""Running rollouts: one gateway session per rollout, the agent through the runtime.

``RolloutRunner.run_one`` owns a session from creation to drop, so no turn is
ever recorded outside a session the trainer knows about, and a rollout's
rows are stamped with its status and reward before they leave.
``start_rollout_stack`` brings up what every host of rollouts needs (the
gateway's HTTP server, the configured runtime, a runner over both): core's
loop, the verl agent-loop workers and slime's rollout processes share it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.types import RolloutRequest, RolloutResult, RolloutStatus, SamplingParams, TraceRecord


@dataclass
class RolloutOutcome:
    """A finished rollout with the rows the gateway recorded for it."""

    request: RolloutRequest
    """What was run."""
    result: RolloutResult
    """What the runtime reported."""
    rows: list[TraceRecord]
    """Trace rows of the rollout's session (possibly empty)."""

    @property
    def ok(self) -> bool:
        return self.result.status is RolloutStatus.OK


@dataclass
class RolloutStack:
    """A started gateway server, runtime and the runner over both."""

    server: Any
    """The ``GatewayServer`` agents call."""
    runtime: Any
    """The started ``RolloutRuntime``."""
    runner: RolloutRunner
    """Runs rollouts through both."""

    async def aclose(self) -> None:
        """Stop the runtime, then the server."""
        try:
            await self.runtime.aclose()
        finally:
            await self.server.stop()


async def start_rollout_stack(
    cfg: Any, gateway: Any, *, model_id: str, public_host: str = "", plugins: Any = None
) -> RolloutStack:
    """Serve ``gateway`` over HTTP and start ``runtime=<cfg.runtime.name>`` against it.

    Args:
        cfg: The composed config (``gateway``, ``runtime`` and ``trainer`` sections).
        gateway: The in-process ``Gateway``.
        model_id: Model name agents pass.
        public_host: Address agents dial, when it differs from ``cfg.gateway.host``
            (default: ``cfg.gateway.public_host``).
        plugins: Loaded plugins to find the runtime in (default: ``load_plugins()``).
    """
    from core.gateway import GatewayServer
    from core.plugins import load_plugins

    server = GatewayServer(
        gateway,
        host=str(cfg.gateway.host),
        port=int(cfg.gateway.port),
        public_host=public_host or str(cfg.gateway.public_host or ""),
    )
    await server.start()
    try:
        runtime = (plugins or load_plugins()).runtime(str(cfg.runtime.name)).factory(cfg)
        await runtime.start()
    except BaseException:
        await server.stop()
        raise
    runner = RolloutRunner(
        gateway=gateway,
        base_url=server.base_url,
        runtime=runtime,
        model_id=model_id,
        max_concurrency=int(cfg.trainer.max_concurrent_rollouts),
        timeout_s=float(cfg.trainer.rollout_timeout_s),
    )
    return RolloutStack(server=server, runtime=runtime, runner=runner)


class RolloutRunner:
    """Runs rollouts through a runtime against the gateway, at most ``max_concurrency`` at once."""

    def __init__(
        self,
        *,
        gateway: Any,
        base_url: str,
        runtime: Any,
        model_id: str,
        max_concurrency: int,
        timeout_s: float,
    ) -> None:
        self.gateway = gateway
        self.base_url = base_url
        self.runtime = runtime
        self.model_id = model_id
        self.timeout_s = timeout_s
        self._sem = asyncio.Semaphore(max_concurrency)

    async def run_one(
        self, payload: dict[str, Any], *, group_id: str, sampling: SamplingParams
    ) -> RolloutOutcome:
        """Run one rollout in its own session; ``sampling.seed``, when set, seeds it."""
        rollout_id = uuid.uuid4().hex
        async with self._sem:
            sid = self.gateway.create_session(
                sampling=sampling, metadata={"rollout_id": rollout_id, "group_id": group_id}
            )
            request = RolloutRequest(
                rollout_id=rollout_id,
                group_id=group_id,
                payload=payload,
                base_url=self.base_url,
                session_id=sid,
                model_id=self.model_id,
                timeout_s=self.timeout_s,
            )
            try:
                result = await self.runtime.run_rollout(request)
            finally:
                rows = self.gateway.finish_session(sid)
                self.gateway.drop_session(sid)
        reward = result.reward if result.status is RolloutStatus.OK else None
        rows = [
            replace(r, rollout_id=rollout_id, group_id=group_id, reward=reward, status=result.status)
            for r in rows
        ]
        return RolloutOutcome(request=request, result=result, rows=rows)

    async def run_groups(
        self,
        payloads: Sequence[tuple[str, dict[str, Any]]],
        *,
        group_size: int,
        sampling: SamplingParams,
        on_done: Callable[[RolloutOutcome], None] | None = None,
    ) -> list[RolloutOutcome]:
        """``group_size`` rollouts of each ``(group_id, payload)``, all concurrently."""

        async def one(group_id: str, payload: dict[str, Any], seed: int | None) -> RolloutOutcome:
            outcome = await self.run_one(
                payload, group_id=group_id, sampling=replace(sampling, seed=seed)
            )
            if on_done is not None:
                on_done(outcome)
            return outcome

        def seed_of(index: int) -> int | None:
            # Reproducible runs: rollout i of a seeded call gets its own stream.
            return None if sampling.seed is None else (sampling.seed + 7_919 * index) % (2**63)

        tasks = [
            one(gid, p, seed_of(i * group_size + k))
            for i, (gid, p) in enumerate(payloads)
            for k in range(group_size)
        ]
        return list(await asyncio.gather(*tasks))

"""Running rollouts: one gateway session per rollout, the agent through the runtime.

``RolloutRunner.run_one`` owns a session from creation to drop, so no turn is
ever recorded outside a session the trainer knows about, and a rollout's
rows are stamped with its status and reward before they leave. It is also
where a rollout the runtime called ``ok`` is checked against what the gateway
saw (``classify``): a reward earned on a broken model call, one earned
without any model call, or an absurdly large one is not a clean sample, and
every backend (core's loop, verl, slime) must see the same status for it.
``start_rollout_stack`` brings up what every host of rollouts needs (the
gateway's HTTP server, the configured runtime, a runner over both): core's
loop, the verl agent-loop workers and slime's rollout processes share it.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.errors import ConfigError
from core.trainer.traces import conversation_tree
from core.types import RolloutRequest, RolloutResult, RolloutStatus, SamplingParams, TraceRecord

EXCLUDE_ON_CHOICES: dict[str, str] = {
    "sampler_error": "sampler_errors",
    "in_flight": "in_flight_at_finish",
    "aborted": "aborted_turns",
    "disconnected": "disconnected_turns",
}
"""``trainer.exclude_on`` names and the session fault counter each one reads."""

DEFAULT_EXCLUDE_ON: tuple[str, ...] = ("sampler_error", "in_flight", "aborted")
"""Faults that make an ``ok`` rollout ``sampler_error`` unless configured otherwise.
``disconnected`` is left out: the client chose to drop that call (its own timeout,
a cancelled speculative call), and the trace holds exactly what the agent received."""

DEFAULT_MAX_ABS_REWARD = 1e9
"""Largest ``|reward|`` accepted by default (``trainer.max_abs_reward``)."""

DEFAULT_REWARD_TIMEOUT_S = 60.0
"""How long a rollout that finished ``reward_pending`` waits for its reward (``reward.timeout_s``)."""

FAULT_KEYS: tuple[str, ...] = (
    "sampler_errors",
    "in_flight_at_finish",
    "aborted_turns",
    "disconnected_turns",
)
"""The gateway's per-session fault counters a ``RolloutOutcome`` carries."""


@dataclass
class RolloutOutcome:
    """A finished rollout with the rows the gateway recorded for it."""

    request: RolloutRequest
    """What was run."""
    result: RolloutResult
    """What the runtime reported."""
    rows: list[TraceRecord]
    """Trace rows of the rollout's session (possibly empty)."""
    faults: dict[str, int] = field(default_factory=dict)
    """The session's fault counters (``FAULT_KEYS``), ``model_turns`` (turns recorded)
    and ``finished_early``/``session_lost`` when the runner found the session
    already finished or dropped. Read from the session itself, so a rollout whose
    only model call failed (no rows) still shows it."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The session's message tree as the gateway recorded it (``core.trainer.traces.
    conversation_tree``): what the agent sent and what the model replied, forks included."""

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
    trainer = cfg.trainer
    runner = RolloutRunner(
        gateway=gateway,
        base_url=server.base_url,
        runtime=runtime,
        model_id=model_id,
        max_concurrency=int(trainer.max_concurrent_rollouts),
        timeout_s=float(trainer.rollout_timeout_s),
        exclude_on=[str(x) for x in _setting(trainer, "exclude_on", DEFAULT_EXCLUDE_ON)],
        max_abs_reward=float(_setting(trainer, "max_abs_reward", DEFAULT_MAX_ABS_REWARD)),
        reward_timeout_s=float(_setting(_setting(cfg, "reward", {}), "timeout_s", DEFAULT_REWARD_TIMEOUT_S)),
    )
    return RolloutStack(server=server, runtime=runtime, runner=runner)


def _setting(section: Any, key: str, default: Any) -> Any:
    """``section.key``, or ``default`` for configs built before the key existed."""
    try:
        value = section.get(key, default) if hasattr(section, "get") else getattr(section, key, default)
    except Exception:  # a config node without the key (struct mode)
        return default
    return default if value is None else value


def check_exclude_on(names: Iterable[str]) -> frozenset[str]:
    """Validate ``trainer.exclude_on``; returns the names as a set."""
    chosen = frozenset(str(n) for n in names)
    unknown = sorted(chosen - set(EXCLUDE_ON_CHOICES))
    if unknown:
        raise ConfigError(
            f"trainer.exclude_on has {unknown!r}; choose from {sorted(EXCLUDE_ON_CHOICES)} "
            f"(default {list(DEFAULT_EXCLUDE_ON)}, [] trains every rollout the agent called ok)"
        )
    return chosen


def classify(
    result: RolloutResult,
    faults: Mapping[str, int] | None,
    *,
    exclude_on: frozenset[str] = frozenset(DEFAULT_EXCLUDE_ON),
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
) -> RolloutResult:
    """The status a rollout trains under, given what the gateway saw of it.

    Only an ``ok`` result can change (a failed one keeps its status):

    - ``invalid_reward`` when ``|reward| > max_abs_reward`` (a sentinel or a bug; it
      would also swamp its group's statistics);
    - ``sampler_error`` when a fault named in ``exclude_on`` happened (a model call
      failed or was aborted in the gateway, or was still in flight when the agent
      returned): the reward was earned on a broken turn;
    - ``no_model_calls`` when the session recorded no turn: nothing to train, and
      the reward says nothing about the policy.

    ``faults`` None: no gateway saw the rollout (an evaluation against
    ``eval.endpoint``), so only the reward bound can be checked.
    """
    if result.status is not RolloutStatus.OK:
        return result
    reward = float(result.reward)  # type: ignore[arg-type]  # OK results carry a finite reward
    if abs(reward) > max_abs_reward:
        return _failed(
            result,
            RolloutStatus.INVALID_REWARD,
            f"the agent's reward {reward!r} is larger in magnitude than trainer.max_abs_reward="
            f"{max_abs_reward!r}; rescale the reward or raise the bound",
        )
    if faults is None:
        return result
    hits = {
        name: int(faults.get(counter, 0))
        for name, counter in EXCLUDE_ON_CHOICES.items()
        if name in exclude_on and int(faults.get(counter, 0)) > 0
    }
    if hits:
        seen = ", ".join(f"{EXCLUDE_ON_CHOICES[n]}={k}" for n, k in hits.items())
        return _failed(
            result,
            RolloutStatus.SAMPLER_ERROR,
            f"the agent returned reward {reward!r}, but its session had {seen}: the reward was "
            "earned on a broken model call, so the rollout is excluded (trainer.exclude_on="
            f"{sorted(exclude_on)} decides which faults exclude)",
        )
    if int(faults.get("model_turns", 0)) == 0:
        return _failed(
            result,
            RolloutStatus.NO_MODEL_CALLS,
            f"the agent returned reward {reward!r} without a model call through the gateway: "
            "nothing to train, and the reward says nothing about the policy",
        )
    return result


def _failed(result: RolloutResult, status: RolloutStatus, error: str) -> RolloutResult:
    return RolloutResult(
        rollout_id=result.rollout_id,
        status=status,
        reward=None,
        metrics=result.metrics,
        error=error,
        elapsed_s=result.elapsed_s,
    )


def _lost(result: RolloutResult) -> RolloutResult:
    note = (
        "the rollout's gateway session was dropped before it finished (DELETE "
        "/admin/sessions/<id>?), so its trace is lost and nothing of it can be trained"
    )
    if result.status is not RolloutStatus.OK:
        return replace(result, error=f"{result.error or result.status.value}; {note}")
    return _failed(result, RolloutStatus.CRASHED, note)


class RolloutRunner:
    """Runs rollouts through a runtime against the gateway, at most ``max_concurrency`` at once.

    Args:
        exclude_on: Session faults that turn an ``ok`` rollout into ``sampler_error``
            (``EXCLUDE_ON_CHOICES``; see ``classify``).
        max_abs_reward: Rewards larger in magnitude become ``invalid_reward``.
        reward_timeout_s: How long a ``reward_pending`` rollout waits for its reward to be
            posted (``gateway.late_rewards``) before it becomes ``reward_timeout``.
    """

    def __init__(
        self,
        *,
        gateway: Any,
        base_url: str,
        runtime: Any,
        model_id: str,
        max_concurrency: int,
        timeout_s: float,
        exclude_on: Iterable[str] = DEFAULT_EXCLUDE_ON,
        max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
        reward_timeout_s: float = DEFAULT_REWARD_TIMEOUT_S,
    ) -> None:
        if not (reward_timeout_s >= 0 and math.isfinite(reward_timeout_s)):
            raise ConfigError(f"reward.timeout_s must be a finite number >= 0, got {reward_timeout_s!r}")
        self.reward_timeout_s = reward_timeout_s
        self.gateway = gateway
        self.base_url = base_url
        self.runtime = runtime
        self.model_id = model_id
        self.timeout_s = timeout_s
        self.exclude_on = check_exclude_on(exclude_on)
        if not (max_abs_reward > 0 and math.isfinite(max_abs_reward)):
            raise ConfigError(
                f"trainer.max_abs_reward must be a finite number > 0, got {max_abs_reward!r}"
            )
        self.max_abs_reward = max_abs_reward
        self._sem = asyncio.Semaphore(max_concurrency)
        self._active: dict[str, str] = {}
        """Rollout id -> group id of the rollouts the runtime is running."""

    async def run_one(
        self, payload: dict[str, Any], *, group_id: str, sampling: SamplingParams
    ) -> RolloutOutcome:
        """Run one rollout in its own session; ``sampling.seed``, when set, seeds it.

        Never raises for the agent's or the session's faults: they come back as
        the outcome's status (see ``classify``).
        """
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
            self._active[rollout_id] = group_id
            late = getattr(self.gateway, "late_rewards", None)
            if late is not None:
                late.expect(rollout_id)
            try:
                result = await self.runtime.run_rollout(request)
            except BaseException:
                # Cancelled (the async pool closing) or a runtime breaking its contract:
                # the rollout will never wait for a reward, so stop accepting one.
                if late is not None:
                    late.forget(rollout_id)
                raise
            finally:
                self._active.pop(rollout_id, None)
                rows, faults, conversation = self._close_session(sid)
        if result.status is RolloutStatus.REWARD_PENDING and late is not None:
            result = await self._await_reward(late, result)
        elif late is not None:
            late.forget(rollout_id)
        if faults.get("session_lost"):
            result = _lost(result)
        else:
            result = classify(
                result, faults, exclude_on=self.exclude_on, max_abs_reward=self.max_abs_reward
            )
        reward = result.reward if result.status is RolloutStatus.OK else None
        rows = [
            replace(r, rollout_id=rollout_id, group_id=group_id, reward=reward, status=result.status)
            for r in rows
        ]
        return RolloutOutcome(
            request=request, result=result, rows=rows, faults=faults, conversation=conversation
        )

    async def _await_reward(self, late: Any, result: RolloutResult) -> RolloutResult:
        """The pending ``result`` with its posted reward, or ``reward_timeout``."""
        reward = await late.wait(result.rollout_id, self.reward_timeout_s)
        if reward is None:
            return RolloutResult(
                result.rollout_id,
                RolloutStatus.REWARD_TIMEOUT,
                metrics=result.metrics,
                error=(
                    f"the agent left its reward pending and none was posted within reward.timeout_s="
                    f"{self.reward_timeout_s:g} (POST /admin/rollouts/{result.rollout_id}/reward)"
                ),
                elapsed_s=result.elapsed_s,
            )
        return replace(result, status=RolloutStatus.OK, reward=reward, error=None)

    async def cancel_groups(self, group_ids: Iterable[str]) -> None:
        """Ask the runtime to stop every running rollout of ``group_ids`` (their
        ``run_one`` then returns a failed outcome)."""
        wanted = set(group_ids)
        for rollout_id, group_id in list(self._active.items()):
            if group_id in wanted:
                await self.runtime.cancel(rollout_id)

    def _close_session(
        self, sid: str
    ) -> tuple[list[TraceRecord], dict[str, int], list[dict[str, Any]]]:
        """Finish and drop ``sid``; its rows, fault counters and conversation tree.

        Tolerates a session someone else already finished (its rows are still
        there) or dropped (its trace is lost: ``session_lost``), so one odd
        session never fails the step it belongs to.
        """
        try:
            session = self.gateway.session(sid)
        except Exception:  # dropped (admin DELETE): nothing left to read
            return [], {"session_lost": 1, "model_turns": 0}, []
        faults = {key: int(session.counters.get(key, 0)) for key in FAULT_KEYS if key != "in_flight_at_finish"}
        faults["in_flight_at_finish"] = int(session.in_flight)
        faults["model_turns"] = len(session.turns)
        conversation = conversation_tree(session.root, session.turns)
        try:
            if session.closed:
                faults["finished_early"] = 1
                rows = self.gateway.peek_rows(sid)
            else:
                rows = self.gateway.finish_session(sid)
        except Exception:  # the session went away between the two calls
            rows, faults["session_lost"] = [], 1
        finally:
            self.gateway.drop_session(sid)
        return rows, faults, conversation

    async def run_groups(
        self,
        payloads: Sequence[tuple[str, dict[str, Any]]],
        *,
        group_size: int,
        sampling: SamplingParams,
        on_done: Callable[[RolloutOutcome], None] | None = None,
    ) -> list[RolloutOutcome]:
        """``group_size`` rollouts of each ``(group_id, payload)``, all concurrently."""
        return await run_groups(
            self.run_one, payloads, group_size=group_size, sampling=sampling, on_done=on_done
        )


RunOne = Callable[..., Awaitable[RolloutOutcome]]
"""A runner's ``run_one(payload, *, group_id, sampling)``."""


async def run_groups(
    run_one: RunOne,
    payloads: Sequence[tuple[str, dict[str, Any]]],
    *,
    group_size: int,
    sampling: SamplingParams,
    on_done: Callable[[RolloutOutcome], None] | None = None,
) -> list[RolloutOutcome]:
    """``group_size`` rollouts of each ``(group_id, payload)`` through ``run_one``, all
    concurrently, in order; what both ``RolloutRunner`` and the eval's ``EndpointRunner`` do.

    A seeded ``sampling`` gives rollout i its own seed (``seed + 7919 * i``), so a run
    repeats and no two samples of a prompt share a stream.
    """

    async def one(group_id: str, payload: dict[str, Any], seed: int | None) -> RolloutOutcome:
        outcome = await run_one(payload, group_id=group_id, sampling=replace(sampling, seed=seed))
        if on_done is not None:
            on_done(outcome)
        return outcome

    def seed_of(index: int) -> int | None:
        return None if sampling.seed is None else (sampling.seed + 7_919 * index) % (2**63)

    tasks = [
        one(gid, p, seed_of(i * group_size + k))
        for i, (gid, p) in enumerate(payloads)
        for k in range(group_size)
    ]
    return list(await asyncio.gather(*tasks))

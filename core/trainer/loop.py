"""The GRPO loop for backends core drives (local, Tinker, SageMaker).

Per step: take ``batch_size`` payloads, run ``group_size`` rollouts of each
through the runtime and the gateway, turn the recorded rows into datums with
group-relative advantages (failed rollouts excluded), ``forward_backward``,
``optim_step``, rebind the gateway to the new sampler; evaluate and
checkpoint on schedule. A step whose groups carry no signal (all constant,
lone or failed) skips the update (``train/skipped``), unless the loss has an
entropy bonus. Guards: a canary
rollout before training, an abort when a step's rollout failure rate passes
``max_failure_rate``, one run at a time per ``run_dir``, and no fresh run
over an old run's checkpoints.

``sampler=vllm|sglang`` (``core.trainer.fleet``) samples from inference servers
instead of the backend's sampler: before the first rollout and after each
optimizer step the backend's weights are written to disk and loaded into
every server, and the gateway is rebound once all of them report the version.

``trainer.mode=async`` replaces the rollout phase with ``RolloutPool.take``:
rollouts run continuously and a step trains on the first ``batch_size`` groups
that finished within ``trainer.max_staleness`` (``core.trainer.pool``); the
rest of the step is the same.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from core.algo.advantages import STD_KINDS
from core.algo.losses import parse_loss_spec
from core.errors import ConfigError, RunAborted
from core.eval.run import eval_metrics, run_eval
from core.gateway.config import GatewayConfig
from core.rewards.stage import build_reward_stage, component_metrics
from core.rollout import (
    FAULT_KEYS,
    DataOrder,
    RolloutOutcome,
    check_exclude_on,
    prepare_data,
    start_rollout_stack,
)
from core.rundir.checkpoint import (
    RunDirLock,
    checkpoint_dir,
    existing_checkpoints,
    latest_checkpoint,
    write_trainer_state,
)
from core.rundir.metrics import MetricsWriter, console_line
from core.rundir.report import write_report
from core.rundir.traces import TraceWriter
from core.trainer.fleet import Fleet, build_fleet
from core.trainer.pool import RolloutPool, check_async_settings, rollout_staleness
from core.trainer.signal import TOKEN_MEAN_OVER, StepSignal, build_signal
from core.types import AdamParams, Datum, RolloutStatus, SamplingParams


@dataclass
class StepTimes:
    """Seconds spent in each phase of one step."""

    rollout: float = 0.0
    train: float = 0.0
    sync: float = 0.0
    eval: float = 0.0
    checkpoint: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


_CLIP_KEYS = ("clip_low", "clip_high", "clip_low_threshold", "clip_high_threshold")
_UNCLIPPED_LOSSES = ("cross_entropy", "importance_sampling")


def check_loss_config(loss: str, loss_config: Any) -> None:
    """Refuse, before any rollout, a ``loss_config`` that contradicts ``loss``.

    ``cross_entropy`` and ``importance_sampling`` clip nothing, and every backend
    refuses clip keys for them, but only at the first ``forward_backward``, after
    a step of rollouts.
    """
    config = OmegaConf.to_container(loss_config, resolve=True) if OmegaConf.is_config(loss_config) else loss_config
    if not isinstance(config, dict):
        raise ConfigError(f"algorithm.loss_config must be a mapping of names to numbers, got {config!r}")
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"algorithm.loss_config.{key!s} must be a number, got {value!r}")
    # What every backend checks the same way (keys, clip ranges, entropy sign), before any rollout.
    parse_loss_spec(loss, {str(k): v for k, v in config.items()}, backend="core", hint="See docs/architecture.md.")
    clips = sorted(str(k) for k in config if k in _CLIP_KEYS)
    if loss in _UNCLIPPED_LOSSES and clips:
        drop = " ".join(f"~algorithm.loss_config.{k}" for k in clips)
        raise ConfigError(
            f"algorithm.loss={loss} clips nothing, but algorithm.loss_config sets {clips}; "
            f"drop them with '{drop}' on the command line (Hydra merges "
            "'algorithm.loss_config={}' into a config instead of replacing it), or use "
            "loss=ppo or cispo"
        )


class Trainer:
    """One training run; ``await Trainer(cfg, plugins).run()`` returns an exit code."""

    def __init__(self, cfg: Any, plugins: Any) -> None:
        self.cfg = cfg
        self.plugins = plugins
        self.run_dir = Path(str(cfg.run_dir))
        self.t = cfg.trainer
        self.algo = cfg.algorithm
        if self.algo.loss not in ("cross_entropy", "importance_sampling", "ppo", "cispo"):
            raise ConfigError(
                f"algorithm.loss={self.algo.loss!r}; use cross_entropy, importance_sampling, ppo or cispo"
            )
        check_loss_config(str(self.algo.loss), self.algo.loss_config)
        if self.algo.token_mean_over not in TOKEN_MEAN_OVER:
            raise ConfigError(
                f"algorithm.token_mean_over={self.algo.token_mean_over!r}; use batch or trained"
            )
        if str(self.algo.get("std", "population")) not in STD_KINDS:
            raise ConfigError(
                f"algorithm.std={self.algo.std!r}; use population (divide by n) or sample (by n - 1)"
            )
        if self.t.batch_size < 1 or self.t.group_size < 1:
            raise ConfigError("trainer.batch_size and trainer.group_size must be >= 1")
        check_exclude_on(self.t.get("exclude_on", []))
        check_async_settings(self.t, self.algo)
        self.mode = str(self.t.get("mode", "sync"))
        self.max_staleness = int(self.t.get("max_staleness", 1))
        max_abs = float(self.t.get("max_abs_reward", 1e9))
        if not (max_abs > 0 and math.isfinite(max_abs)):
            raise ConfigError(f"trainer.max_abs_reward must be a finite number > 0, got {max_abs!r}")
        self.step = 0
        self._last_batch: list[int] = []
        self._closers: list[Any] = []
        self._lock: RunDirLock | None = None
        self.pool: RolloutPool | None = None
        self.fleet: Fleet | None = None
        self._async_resume: dict[str, Any] = {"next_seq": 0, "pending": []}
        self._reruns = 0

    # -- setup --------------------------------------------------------------

    async def _setup(self) -> None:
        from core.gateway import Gateway

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = RunDirLock(self.run_dir)  # raises while another run uses run_dir
        if not self.t.resume:
            found = existing_checkpoints(self.run_dir)
            if found:
                raise ConfigError(
                    f"run_dir {self.run_dir} already holds checkpoints ({found[-1].name} and "
                    f"{len(found) - 1} more) of an earlier run; pass trainer.resume=true to continue "
                    "it, or choose a new run_dir (a fresh run there would mix its metrics and "
                    "checkpoints with the old ones)"
                )
            metrics = self.run_dir / "metrics.jsonl"
            if metrics.exists() and metrics.stat().st_size > 0:
                raise ConfigError(
                    f"run_dir {self.run_dir} already holds {metrics.name} of an earlier run that "
                    "saved no checkpoint; choose a new run_dir, or delete that file to start over "
                    "there (a fresh run would append its steps to the old run's metrics)"
                )
        self.train_rows, self.eval_rows = prepare_data(self.cfg, self.run_dir)
        self.order = DataOrder(size=len(self.train_rows), seed=int(self.cfg.seed))

        spec = self.plugins.backend(str(self.cfg.backend.name))
        self.backend = spec.factory(self.cfg)
        self._closers.append(self.backend.aclose)
        self.fleet = build_fleet(self.cfg, self.backend, self.run_dir)  # sampler=vllm|sglang
        if self.fleet is not None:
            self._closers.append(self.fleet.aclose)
        gw_cfg = GatewayConfig(**OmegaConf.to_container(self.cfg.gateway, resolve=True))  # type: ignore[arg-type]
        self.gateway = Gateway(
            tokenizer=self.backend.get_tokenizer(),
            sampler=self._sampler(),
            config=gw_cfg,
            model_id=self.backend.model_id(),
        )
        stack = await start_rollout_stack(
            self.cfg, self.gateway, model_id=self.backend.model_id(), plugins=self.plugins
        )
        self._closers.append(stack.aclose)
        self.server, self.runtime, self.runner = stack.server, stack.runtime, stack.runner
        self.rewards = build_reward_stage(self.cfg, self.plugins, self.runner)
        self._closers.append(self.rewards.aclose)
        loggers = list(self.t.loggers)
        self.metrics = MetricsWriter(
            self.run_dir, loggers, config=OmegaConf.to_container(self.cfg, resolve=True)  # type: ignore[arg-type]
        )
        self._closers.append(self._close_metrics)
        self.console = "console" in loggers
        self.traces = TraceWriter(
            self.run_dir, int(self.t.get("save_traces", 1)), self.gateway.renderer.decode, int(self.t.get("keep_traces", 0))
        )

    def _sampler(self) -> Any:
        """What the gateway samples with: the fleet's HTTP sampler, or the backend's own."""
        return self.fleet.sampler if self.fleet is not None else self.backend.sampler

    async def _sync(self) -> Any:
        """Serve the trained weights; with a fleet, push them and return once every server has them."""
        sampler = await self.backend.sync_sampler()
        if self.fleet is None:
            return sampler
        await self.fleet.push(self.backend)
        return self.fleet.sampler

    async def _close_metrics(self) -> None:
        self.metrics.close()

    async def _teardown(self) -> None:
        for close in reversed(self._closers):
            try:
                await close()
            except Exception as exc:  # keep closing the rest; say what failed
                print(f"warning: shutdown step failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        self._closers.clear()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _sampling(self, temperature: float, *, stream: int = 0) -> SamplingParams:
        """Session sampling settings; seeded from ``seed``, the step and ``stream`` so a
        run (and a resumed run) samples the same tokens every time."""
        seed = (int(self.cfg.seed) * 1_000_003 + self.step * 65_537 + stream) % (2**62)
        return SamplingParams(
            max_tokens=int(self.algo.max_tokens), temperature=float(temperature), seed=seed
        )

    # -- guards ---------------------------------------------------------------

    async def _canary(self) -> None:
        """One rollout that must reach the gateway and return a reward."""
        outcome = await self.runner.run_one(
            self.train_rows[0],
            group_id="canary",
            sampling=self._sampling(self.algo.temperature, stream=1),
        )
        result = outcome.result
        if result.status is RolloutStatus.NO_MODEL_CALLS:
            raise RunAborted(
                "canary rollout returned a reward but made no model call through the gateway: "
                "the agent must send its requests to payload['_config']['base_url'] with "
                "payload['_config']['api_key'] as its API key; training on it would learn nothing"
            )
        if result.status is not RolloutStatus.OK:
            raise RunAborted(
                f"canary rollout failed with status {result.status.value!r}: "
                f"{(result.error or 'no error text').strip()[-2000:]}\n"
                "Check that the agent starts (task.agent), reaches the gateway at the base_url "
                "it is given, and returns {'reward': <float>}."
            )

    def _check_failures(self, outcomes: list[RolloutOutcome]) -> Counter[str]:
        statuses = Counter(o.result.status.value for o in outcomes)
        failed = sum(n for s, n in statuses.items() if s != RolloutStatus.OK.value)
        rate = failed / max(1, len(outcomes))
        if rate > float(self.t.max_failure_rate):
            errors = [o.result.error for o in outcomes if o.result.error][:3]
            raise RunAborted(
                f"step {self.step + 1}: {failed} of {len(outcomes)} rollouts failed "
                f"({rate:.0%} > trainer.max_failure_rate={self.t.max_failure_rate}); statuses: "
                f"{dict(statuses)}; first errors: {errors}"
            )
        return statuses

    # -- phases -------------------------------------------------------------

    async def _rollouts(self) -> list[RolloutOutcome]:
        indices = self.order.next_batch(int(self.t.batch_size))
        self._last_batch = indices
        payloads = [(f"s{self.step + 1}-g{i}", self.train_rows[idx]) for i, idx in enumerate(indices)]
        bar = None
        if self.t.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=len(payloads) * int(self.t.group_size),
                desc=f"step {self.step + 1} rollouts",
                leave=False,
                disable=None,
                file=sys.stderr,
            )
        try:
            return await self.runner.run_groups(
                payloads,
                group_size=int(self.t.group_size),
                sampling=self._sampling(self.algo.temperature),
                on_done=(lambda _o: bar.update(1)) if bar is not None else None,
            )
        finally:
            if bar is not None:
                bar.close()

    def _signal(self, outcomes: list[RolloutOutcome]) -> StepSignal:
        return build_signal(
            outcomes,
            normalize_std=bool(self.algo.normalize_std),
            exclude_failed=bool(self.algo.exclude_failed),
            std=str(self.algo.get("std", "population")),
            token_mean_over=str(self.algo.token_mean_over),
        )

    async def _train(self, datums: list[Datum]) -> dict[str, float]:
        loss_config = dict(OmegaConf.to_container(self.algo.loss_config, resolve=True))  # type: ignore[arg-type]
        loss_config.setdefault("temperature", float(self.algo.temperature))
        if float(self.algo.get("tis_cap", 0.0)):
            loss_config["tis_cap"] = float(self.algo.tis_cap)
        result = await self.backend.forward_backward(datums, self.algo.loss, loss_config)
        opt = await self.backend.optim_step(
            AdamParams(
                learning_rate=float(self.algo.learning_rate),
                beta1=float(self.algo.beta1),
                beta2=float(self.algo.beta2),
                weight_decay=float(self.algo.weight_decay),
                grad_clip_norm=float(self.algo.grad_clip_norm),
            )
        )
        out = {f"train/{k.replace('/', '_')}": float(v) for k, v in result.metrics.items()}
        out.update({f"optim/{k}": float(v) for k, v in opt.items()})
        return out

    async def evaluate(self) -> dict[str, float]:
        """Mean reward over the eval rows, one rollout each, at the eval temperature
        (``core.eval.run_eval``, as ``python -m core.eval`` runs them)."""
        payloads = self.eval_rows[: int(self.t.eval_size)]
        if not payloads:
            return {}
        outcomes, rows = await run_eval(
            self.runner,
            payloads,
            samples_per_prompt=1,
            sampling=self._sampling(self.algo.eval_temperature, stream=2),
            rewards=self.rewards,
        )
        await self.traces.awrite_step(self.step, outcomes, {}, kind="eval")
        return eval_metrics(rows, pass_threshold=float(self.cfg.eval.pass_threshold))

    async def _checkpoint(self, async_state: dict[str, Any] | None = None) -> float:
        """Save the backend and the loop's state; ``async_state`` is the pool's snapshot,
        taken together with ``self.order`` (before any await) so the two agree."""
        t0 = time.perf_counter()
        data = self.order.state()
        path = checkpoint_dir(self.run_dir, self.step)
        path.mkdir(parents=True, exist_ok=True)
        where = await self.backend.save_state(str(path / "backend"))
        state: dict[str, Any] = {"step": self.step, "data": data, "backend_path": where}
        if async_state is not None:
            state["async"] = async_state
        write_trainer_state(path, state)
        return time.perf_counter() - t0

    async def _resume(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise ConfigError(
                f"trainer.resume=true but {self.run_dir / 'checkpoints'} holds no complete "
                "checkpoint; set run_dir to the run to resume"
            )
        await self.backend.load_state(str(ckpt.state["backend_path"]))
        self.gateway.set_sampler(self._sampler())  # a fleet gets the restored weights in run()
        self.order.restore(ckpt.state["data"])
        self.step = ckpt.step
        saved = ckpt.state.get("async")
        if saved is not None and saved.get("pending") and self.mode != "async":
            raise ConfigError(
                f"checkpoint {ckpt.path} was written by trainer.mode=async with "
                f"{len(saved['pending'])} groups in flight; resume it with trainer.mode=async "
                "(a sync run would skip their rows)"
            )
        if saved is None:
            # A sync checkpoint: number the groups on from its steps, so their seeds
            # continue the synchronous sequence (see _group_sampling).
            self._async_resume = {"next_seq": self.step * int(self.t.batch_size), "pending": []}
        else:
            self._async_resume = {
                "next_seq": int(saved["next_seq"]),
                "pending": [(int(a), int(b)) for a, b in saved["pending"]],
            }
            self._reruns = len(self._async_resume["pending"])
            if self._reruns:
                print(
                    f"{self._reruns} groups were in flight at the checkpoint; running them again",
                    file=sys.stderr,
                )
        # Steps after this one that an interrupted run logged are replayed now;
        # readers of metrics.jsonl drop the stale copies at this marker.
        self.metrics.mark_resume(self.step)
        print(f"resumed from {ckpt.path} at step {self.step}", file=sys.stderr)

    # -- the loop -------------------------------------------------------------

    def _group_sampling(self, seq: int) -> SamplingParams:
        """Seeded session settings of async group ``seq`` (a rerun samples alike).

        Group ``seq`` gets the seeds the synchronous loop gives group ``seq % batch_size``
        of step ``seq // batch_size``, so ``max_staleness=0`` samples what ``sync`` does.
        """
        batch, group = int(self.t.batch_size), int(self.t.group_size)
        step, index = divmod(seq, batch)
        base = (int(self.cfg.seed) * 1_000_003 + step * 65_537) % (2**62)
        return SamplingParams(
            max_tokens=int(self.algo.max_tokens),
            temperature=float(self.algo.temperature),
            seed=(base + 7_919 * index * group) % (2**63),
        )

    def _start_pool(self) -> None:
        batch, group = int(self.t.batch_size), int(self.t.group_size)
        room = (self.max_staleness + 1) * batch
        in_flight = int(self.t.get("max_rollouts_in_flight", 0)) or room * group
        self.pool = RolloutPool(
            runner=self.runner,
            rows=self.train_rows,
            order=self.order,
            group_size=group,
            max_groups=room,
            max_rollouts=in_flight,
            sampling=self._group_sampling,
            next_seq=int(self._async_resume["next_seq"]),
            requeue=self._async_resume["pending"],
        )
        self.pool.start()

    async def _close_pool(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def _take(self, times: StepTimes) -> tuple[list[RolloutOutcome], dict[str, Any]]:
        """The async rollout phase: the step's groups from the pool."""
        assert self.pool is not None
        groups, dropped, waited = await self.pool.take(
            int(self.t.batch_size), version=int(self.backend.weight_version), max_staleness=self.max_staleness
        )
        times.rollout = waited
        self._last_batch = [g.data_index for g in groups]
        extra: dict[str, Any] = {
            "async/dropped_stale": len(dropped),
            "async/dropped_stale_rollouts": sum(len(g.outcomes) for g in dropped),
            "async/dropped_groups": [g.seq for g in dropped],
            "async/groups": [g.seq for g in groups],
            "async/rerun": sum(1 for g in groups if g.rerun),
            "time/trainer_idle": waited,
        }
        if self._reruns:
            extra["async/rerun_on_resume"], self._reruns = self._reruns, 0
        return [o for g in groups for o in g.outcomes], extra

    async def _one_step(self) -> dict[str, Any]:
        times = StepTimes()
        t_step = time.perf_counter()
        flow: dict[str, Any]
        if self.pool is None:
            outcomes = await self._rollouts()
            times.rollout = time.perf_counter() - t_step
            flow = {"time/trainer_idle": times.rollout}
        else:
            outcomes, flow = await self._take(times)
        t0 = time.perf_counter()
        outcomes = await self.rewards.score(outcomes)  # reward=<name>; the agent's own by default
        flow["time/reward"] = time.perf_counter() - t0
        version = int(self.backend.weight_version)  # the weights these outcomes train
        statuses = self._check_failures(outcomes)
        signal = self._signal(outcomes)
        datums, group_metrics = signal.datums, signal.metrics
        # Stable keys: a step without a learning signal reports NaN (null in JSON) and
        # skips the update: zero-advantage datums would still move the weights through
        # Adam's momentum and bump the weight version for nothing.
        train_metrics: dict[str, float] = {
            "train/loss": math.nan,
            "train/logprob_diff_max": math.nan,
            "train/skipped": 1.0,
        }
        # An entropy bonus (loss_config.entropy_coef) is a gradient without advantages,
        # and cross_entropy (supervised) ignores them.
        needs_no_advantage = self.algo.loss == "cross_entropy" or (
            float(self.algo.loss_config.get("entropy_coef", 0.0)) > 0
        )
        if signal.has_signal or (datums and needs_no_advantage):
            t0 = time.perf_counter()
            train_metrics.update(await self._train(datums))
            train_metrics["train/skipped"] = 0.0
            times.train = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.gateway.set_sampler(await self._sync())
            times.sync = time.perf_counter() - t0
        if self.fleet is not None:
            flow.update(self.fleet.metrics())
        self.step += 1
        async_state = None
        if self.pool is not None:
            await self.pool.release(len(flow["async/groups"]))
            # Cut the started-groups log and snapshot the pool at one instant, so the
            # checkpoint and metrics.jsonl agree on which groups started before it.
            flow["data/started"], finished, flow["time/sampler_idle"] = self.pool.pop_flow()
            flow["rollouts/finished"] = finished
            flow["async/in_flight"] = self.pool.rollouts_in_flight
            async_state = self.pool.state()
        if self.t.save_every and self.step % int(self.t.save_every) == 0 and self.step < int(self.t.max_steps):
            times.checkpoint = await self._checkpoint(async_state)
        eval_metrics: dict[str, float] = {}
        if self.t.eval_every and self.step % int(self.t.eval_every) == 0:
            t0 = time.perf_counter()
            eval_metrics = await self.evaluate()
            times.eval = time.perf_counter() - t0
        step_time = time.perf_counter() - t_step
        record = self._record(outcomes, statuses, datums, group_metrics, train_metrics, eval_metrics, times, step_time)
        record.update(self._flow_metrics(outcomes, version, flow, times, step_time))
        record.update(component_metrics(outcomes))
        record.update(await self.traces.awrite_step(self.step, outcomes, signal.advantages, weight_version=version))
        return record

    def _flow_metrics(
        self,
        outcomes: list[RolloutOutcome],
        version: int,
        flow: dict[str, Any],
        times: StepTimes,
        step_time: float,
    ) -> dict[str, Any]:
        """Staleness of what trained, idle times and throughput (both modes, same keys)."""
        ages = rollout_staleness([o for o in outcomes if o.ok], version)
        out: dict[str, Any] = {
            "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
            "async/staleness_max": max(ages) if ages else 0,
            "async/dropped_stale": 0,
            **flow,
        }
        if self.pool is None:
            # Sync: the sampler has no training rollout while the step trains, syncs,
            # checkpoints and evaluates.
            out["time/sampler_idle"] = max(0.0, step_time - times.rollout)
            out["rollouts/finished"] = len(outcomes)
        out["rollouts/s"] = out["rollouts/finished"] / step_time if step_time > 0 else 0.0
        return out

    def _record(
        self,
        outcomes: list[RolloutOutcome],
        statuses: Counter[str],
        datums: list[Datum],
        group_metrics: dict[str, float],
        train_metrics: dict[str, float],
        eval_metrics: dict[str, float],
        times: StepTimes,
        step_time: float,
    ) -> dict[str, Any]:
        rewards = [o.result.reward for o in outcomes if o.ok and o.result.reward is not None]
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5 if rewards else float("nan")
        rows = [r for o in outcomes for r in o.rows]
        accounted = times.rollout + times.train + times.sync + times.eval + times.checkpoint
        record: dict[str, Any] = {
            "step": self.step,
            "reward/mean": mean,
            "reward/std": std,
            "rollouts/total": len(outcomes),
            "rollouts/ok": statuses.get(RolloutStatus.OK.value, 0),
            "rollouts/failed": len(outcomes) - statuses.get(RolloutStatus.OK.value, 0),
            **{f"rollouts/{s.value}": statuses.get(s.value, 0) for s in RolloutStatus if s is not RolloutStatus.OK},
            "datums": len(datums),
            "tokens/trained": int(sum(sum(d.weights) for d in datums)),
            "tokens/total": sum(len(r.token_ids) for r in rows),
            "turns/total": sum(int(r.metadata.get("turns", len(r.turns))) for r in rows),
            "trace/rows": len(rows),
            "trace/forks": sum(int(r.metadata.get("forks", 0)) for r in rows),
            "trace/ill_formed_tool_calls": sum(int(r.metadata.get("ill_formed_tool_calls", 0)) for r in rows),
            "trace/truncated": sum(int(bool(r.metadata.get("truncated", False))) for r in rows),
            # Read from each rollout's session, so a rollout without rows still counts.
            **{f"faults/{k}": sum(o.faults.get(k, 0) for o in outcomes) for k in FAULT_KEYS},
            "rollouts/with_disconnected_turns": sum(
                1 for o in outcomes if o.faults.get("disconnected_turns", 0) > 0
            ),
            "rollouts/session_finished_early": sum(o.faults.get("finished_early", 0) for o in outcomes),
            "rollouts/session_lost": sum(o.faults.get("session_lost", 0) for o in outcomes),
            "weight_version": int(self.backend.weight_version),
            "data/epoch": self.order.epoch,
            "data/cursor": self.order.cursor,
            "data/batch": list(self._last_batch),
            "time/rollout": times.rollout,
            "time/train": times.train,
            "time/weight_sync": times.sync,
            "time/eval": times.eval,
            "time/checkpoint": times.checkpoint,
            "time/step": step_time,
            "time/loop_overhead_frac": max(0.0, step_time - accounted) / step_time if step_time > 0 else 0.0,
            **group_metrics,
            **train_metrics,
            **eval_metrics,
        }
        return record

    def _emit(self, record: dict[str, Any], bar: Any) -> None:
        self.metrics.write(record)
        if self.console:
            line = console_line(record)
            if bar is not None:
                bar.write(line)
            else:
                print(line, flush=True)

    async def run(self) -> int:
        try:
            await self._setup()
            if self.t.resume:
                await self._resume()
            if self.fleet is not None:
                # The servers start from whatever they loaded; serve the trainer's weights
                # (initial or resumed) before the first rollout.
                pushed = await self.fleet.push(self.backend)
                print(
                    f"sampler={self.fleet.config.kind}: {len(pushed.updated)} server(s) serve weight "
                    f"version {pushed.version} from {self.fleet.weights_dir}",
                    file=sys.stderr,
                )
            if self.step == 0 and self.t.canary:
                await self._canary()
            if self.step == 0 and self.eval_rows:
                self._emit({"step": 0, **await self.evaluate()}, None)
            if self.mode == "async":
                self._start_pool()
                self._closers.append(self._close_pool)
            bar = None
            if self.t.progress:
                from tqdm import tqdm

                bar = tqdm(total=int(self.t.max_steps), initial=self.step, desc="train", disable=None, file=sys.stderr)
            t_run = time.perf_counter()
            try:
                while self.step < int(self.t.max_steps):
                    record = await self._one_step()
                    self._emit(record, bar)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{record['reward/mean']:.3f}")
            finally:
                if bar is not None:
                    bar.close()
            final: dict[str, Any] = {"step": self.step}
            async_state = None
            if self.pool is not None:
                # Groups still running are not trained: saved as pending (a resumed run
                # with more steps runs them again) and counted here.
                async_state = self.pool.state()
                final["async/discarded_at_end"] = await self.pool.close()
            if self.eval_rows and not (self.t.eval_every and self.step % int(self.t.eval_every) == 0):
                final.update(await self.evaluate())
            final["time/train_wall"] = time.perf_counter() - t_run
            await self._checkpoint(async_state)
            self._emit(final, None)
            report = write_report(self.run_dir)
            print(f"run finished at step {self.step}; metrics: {self.metrics.path}; report: {report}")
            return 0
        finally:
            await self._teardown()


def run_training(cfg: Any, plugins: Any) -> int:
    """Run the loop described by ``cfg`` to completion; returns an exit code."""
    return asyncio.run(Trainer(cfg, plugins).run())

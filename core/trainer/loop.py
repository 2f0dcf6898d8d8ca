"""The GRPO loop for backends core drives (local, Tinker, SageMaker).

Per step: take ``batch_size`` payloads, run ``group_size`` rollouts of each
through the runtime and the gateway, turn the recorded rows into datums with
group-relative advantages (failed rollouts excluded), ``forward_backward``,
``optim_step``, rebind the gateway to the new sampler; evaluate and
checkpoint on schedule. A step whose groups carry no signal (all constant,
lone or failed) skips the update (``train/skipped``), unless the loss has an
entropy bonus. Guards (``core.trainer.guards``): a canary rollout before training,
an abort when a step's rollout failure rate passes ``max_failure_rate``, one run
at a time per ``run_dir``, and no fresh run over an old run's checkpoints. A console
warning when a step's tool calls fail to parse far more often than before, or when
tools were offered and no turn called one (``core.trainer.parse_watch``).

With several ``policies`` (a backend that declares ``multi_policy``) the loop builds a
backend per policy (``core.trainer.policies``), the gateway samples each turn with its
policy's sampler, and the update trains, syncs and checkpoints each policy on its own rows.

``sampler=vllm|sglang`` (``core.trainer.fleet``) samples from inference servers
instead of the backend's sampler: before the first rollout and after each
optimizer step the backend's weights are written to disk and loaded into
every server, and the gateway is rebound once all of them report the version.

``trainer.mode=async`` replaces the rollout phase with ``RolloutPool.take``:
rollouts run continuously and a step trains on the first ``batch_size`` groups
that finished (``trainer.max_staleness`` sizes the pool's room; nothing is
dropped, ``core.trainer.pool``); the rest of the step is the same. Both modes sit behind ``core.trainer.source.
RolloutSource``, so the step has no mode branches. The loop reads the config as
``core.trainer.config.TrainConfig`` (checked when converted); plugins get the composed one.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.algo.losses import SAMPLER_LOGPROB_LOSSES
from core.errors import ConfigError
from core.eval.run import eval_metrics, run_eval
from core.plugins.manager import Plugins
from core.plugins.policy_backend import check_policy_tokenizers
from core.rewards.stage import build_reward_stage, component_metrics
from core.rollout import DataOrder, RolloutOutcome, prepare_data, start_rollout_stack
from core.rundir.checkpoint import (
    RunDirLock,
    checkpoint_dir,
    existing_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    write_trainer_state,
)
from core.rundir.metrics import (
    CONSOLE_LEGEND,
    MetricsWriter,
    closing_lines,
    console_line,
    read_metrics,
)
from core.rundir.report import write_report
from core.rundir.traces import TraceWriter
from core.trainer.config import ASYNC_TIS_CAP, AlgorithmConfig, load_train_config, policy_routes
from core.trainer.fleet import Fleet, build_fleet
from core.trainer.guards import (
    check_canary,
    check_failures,
    check_fresh_run_dir,
    check_policy_support,
)
from core.trainer.metrics import StepReport, StepTimes, flow_metrics, step_metrics
from core.trainer.overrides import mask_override_turns
from core.trainer.parse_watch import ParseWatch
from core.trainer.policies import (
    PolicyBackends,
    build_policy_backend,
    check_policy_modes,
    loss_samplings,
    policy_metrics,
    session_sampling,
)
from core.trainer.policy_config import policy_algorithm
from core.trainer.pool import PoolResume, PoolSize, RolloutPool, Versions, mask_stale_turns
from core.trainer.signal import StepSignal, build_signal, check_role_rewards
from core.trainer.source import (
    PoolSource,
    RolloutSource,
    SourceEnd,
    SyncSource,
    resumed_pool,
)
from core.types import AdamParams, Datum, SamplingParams

Closer = Callable[[], Awaitable[Any]]  # an ``aclose`` of something the run started


def tis_cap_of(algo: Any, mode: str, backend: Any) -> float:
    """``algo.tis_cap``, or when not set: ``ASYNC_TIS_CAP`` for an async run with a ratio loss
    on a backend that applies it, else 0 (off)."""
    if algo.tis_cap is not None:
        return float(algo.tis_cap)
    applies = bool(getattr(backend, "truncates_importance_weights", False))
    if mode == "async" and applies and algo.loss in SAMPLER_LOGPROB_LOSSES:
        return ASYNC_TIS_CAP
    return 0.0


class Trainer:
    """One training run; ``await Trainer(cfg, plugins).run()`` returns an exit code.

    ``cfg`` is the composed config: the loop reads it as ``TrainConfig`` (converted and
    checked here, so a bad setting fails before anything starts); the backend, runtime
    and reward plugins get it as composed.
    """

    def __init__(self, cfg: DictConfig, plugins: Plugins) -> None:
        self.composed = cfg
        self.cfg = load_train_config(cfg)
        self.plugins = plugins
        self.run_dir = Path(self.cfg.run_dir)
        self.t = self.cfg.trainer
        self.algo = self.cfg.algorithm
        self.policy_algos = {
            name: policy_algorithm(self.algo, name, self.cfg.policies.get(name))
            for name in policy_routes(self.cfg.policies).names
        }
        """Each policy's ``algorithm``: the run's with the policy's own settings over it."""
        self.loss_samplings = loss_samplings(self.policy_algos)
        """What each policy's loss assumes its turns were sampled with; sessions sample with it."""
        self.step = 0
        self._last_batch: list[int] = []
        self._closers: list[Closer] = []
        self._lock: RunDirLock | None = None
        self.fleet: Fleet | None = None
        self.source: RolloutSource | None = None
        self._resumed = PoolResume(next_seq=0, pending=[])
        self.parse_watch = ParseWatch()

    # -- setup --------------------------------------------------------------

    async def _setup(self) -> None:
        from core.gateway import Gateway

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = RunDirLock(self.run_dir)  # raises while another run uses run_dir
        if not self.t.resume:
            check_fresh_run_dir(self.run_dir)
        self.train_rows, self.eval_rows = prepare_data(self.composed, self.run_dir)
        self.order = DataOrder(size=len(self.train_rows), seed=self.cfg.seed)

        spec = self.plugins.backend(str(self.cfg.backend.name))
        check_policy_support(list(self.cfg.policies), spec)
        check_policy_modes(list(self.cfg.policies), sampler=self.cfg.sampler.kind)
        routes = policy_routes(self.cfg.policies)
        backends: dict[str, Any] = {}
        for name in routes.names:  # a backend per policy (one: today's run), with its own backend settings
            backends[name] = build_policy_backend(spec, self.composed, name, self.cfg.policies.get(name))
            self._closers.append(backends[name].aclose)
        check_policy_tokenizers(backends)  # the gateway renders every policy's turns with one
        self.policies = PolicyBackends(backends)
        self.backend = self.policies.default
        self.fleet = build_fleet(self.composed, self.backend, self.run_dir)  # sampler=vllm|sglang
        if self.fleet is not None:
            self._closers.append(self.fleet.aclose)
        self.gateway = Gateway(
            tokenizer=self.backend.get_tokenizer(),
            sampler=self._sampler(),
            config=self.cfg.gateway,
            model_id=self.backend.model_id(),
            policies=routes,
        )
        for name, backend in self.policies:
            if name != routes.default:
                self.gateway.set_sampler(backend.sampler, policy=name)
        await self._certify_template()
        stack = await start_rollout_stack(
            self.composed, self.gateway, model_id=self.backend.model_id(), plugins=self.plugins
        )
        self._closers.append(stack.aclose)
        if stack.shards is not None and self.fleet is not None:  # gateway.shards > 1
            stack.shards.follow(self.fleet)  # held and released with each push, told its outcome
        self.server, self.runtime, self.runner = stack.server, stack.runtime, stack.runner
        self.rewards = build_reward_stage(self.composed, self.plugins, self.runner)
        self._closers.append(self.rewards.aclose)
        loggers = list(self.t.loggers)
        self.metrics = MetricsWriter(
            self.run_dir, loggers, config=OmegaConf.to_container(self.composed, resolve=True)  # type: ignore[arg-type]
        )
        self._closers.append(self._close_metrics)
        self.console = "console" in loggers
        self.traces = TraceWriter(self.run_dir, self.t.save_traces, self.gateway.renderer.decode, self.t.keep_traces)

    async def _certify_template(self) -> None:
        """Certify the model's chat template (cached by its hash); refuse one whose traces would
        not be exact unless ``gateway.allow_uncertified_template`` (``core.gateway.certify.gate``)."""
        from core.gateway.certify import certify_on_start

        await certify_on_start(self.gateway.renderer.tokenizer, self.cfg.gateway, out_dir=self.run_dir,
                               end_of_turn_ids=self.gateway.end_of_turn_ids)

    @property
    def tis_cap(self) -> float:
        """``algorithm.tis_cap``, or when not set: ``ASYNC_TIS_CAP`` for an async run with a
        ratio loss on a backend that applies it, else 0 (off)."""
        return tis_cap_of(self.algo, self.t.mode, self.backend)

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

    def _sampling(self, *, evaluation: bool = False, stream: int = 0) -> SamplingParams:
        """Session sampling settings (each policy's own, ``session_sampling``; at the eval
        temperatures for an ``evaluation``); seeded from ``seed``, the step and ``stream`` so a
        run (and a resumed run) samples the same tokens every time."""
        seed = (self.cfg.seed * 1_000_003 + self.step * 65_537 + stream) % (2**62)
        return session_sampling(self.policy_algos, evaluation=evaluation, seed=seed)

    # -- guards ---------------------------------------------------------------

    async def _canary(self) -> None:
        """One rollout that must reach the gateway and return a reward."""
        sampling = self._sampling(stream=1)
        check_canary(await self.runner.run_one(self.train_rows[0], group_id="canary", sampling=sampling))

    def _check_failures(self, outcomes: list[RolloutOutcome]) -> Counter[str]:
        return check_failures(outcomes, step=self.step + 1, max_failure_rate=self.t.max_failure_rate)

    # -- phases -------------------------------------------------------------

    async def _rollouts(self) -> list[RolloutOutcome]:
        indices = self.order.next_batch(self.t.batch_size)
        self._last_batch = indices
        payloads = [(f"s{self.step + 1}-g{i}", self.train_rows[idx]) for i, idx in enumerate(indices)]
        bar = None
        if self.t.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=len(payloads) * self.t.group_size,
                desc=f"step {self.step + 1} rollouts",
                leave=False,
                disable=None,
                file=sys.stderr,
            )
        try:
            return await self.runner.run_groups(
                payloads,
                group_size=self.t.group_size,
                sampling=self._sampling(),
                on_done=(lambda _o: bar.update(1)) if bar is not None else None,
            )
        finally:
            if bar is not None:
                bar.close()

    def _signal(self, outcomes: list[RolloutOutcome]) -> StepSignal:
        return build_signal(
            outcomes,
            normalize_std=self.algo.normalize_std,
            exclude_failed=self.algo.exclude_failed,
            std=self.algo.std,
            token_mean_over=self.algo.token_mean_over,
        )

    async def _train(self, datums: list[Datum], backend: Any, algo: AlgorithmConfig) -> dict[str, float]:
        """``forward_backward`` and ``optim_step`` of ``backend`` (one policy's) on ``datums``,
        with that policy's ``algo`` (its loss and optimizer settings)."""
        loss_config = dict(algo.loss_config)
        loss_config.setdefault("temperature", algo.temperature)
        tis_cap = tis_cap_of(algo, self.t.mode, backend)
        if tis_cap:
            loss_config["tis_cap"] = tis_cap
        result = await backend.forward_backward(datums, algo.loss, loss_config)
        opt = await backend.optim_step(
            AdamParams(
                learning_rate=algo.learning_rate,
                beta1=algo.beta1,
                beta2=algo.beta2,
                weight_decay=algo.weight_decay,
                grad_clip_norm=algo.grad_clip_norm,
            )
        )
        out = {f"train/{k.replace('/', '_')}": float(v) for k, v in result.metrics.items()}
        out.update({f"optim/{k}": float(v) for k, v in opt.items()})
        return out

    async def evaluate(self) -> dict[str, float]:
        """Mean reward over the eval rows, one rollout each, at the eval temperature
        (``core.eval.run_eval``, as ``python -m core.eval`` runs them)."""
        payloads = self.eval_rows[: self.t.eval_size]
        if not payloads:
            return {}
        outcomes, rows = await run_eval(
            self.runner,
            payloads,
            samples_per_prompt=1,
            sampling=self._sampling(evaluation=True, stream=2),
            rewards=self.rewards,
        )
        await self.traces.awrite_step(self.step, outcomes, {}, kind="eval")
        return eval_metrics(rows, pass_threshold=self.cfg.eval.pass_threshold)

    async def _checkpoint(self, async_state: dict[str, Any] | None = None) -> float:
        """Save the backend and the loop's state; ``async_state`` is the pool's snapshot,
        taken together with ``self.order`` (before any await) so the two agree."""
        t0 = time.perf_counter()
        data = self.order.state()
        path = checkpoint_dir(self.run_dir, self.step)
        path.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {"step": self.step, "data": data, **await self.policies.save(path / "backend")}
        if async_state is not None:
            state["async"] = async_state
        write_trainer_state(path, state)
        return time.perf_counter() - t0

    def _prune(self, evals: dict[str, float]) -> None:
        """Apply ``trainer.keep_checkpoints``, keeping the best-by-eval one when asked.

        ``evals`` is this step's evaluation, not yet in ``metrics.jsonl``.
        """
        keep: set[int] = set()
        if self.t.keep_best_checkpoint:
            saved = {int(p.name.removeprefix("step_")) for p in existing_checkpoints(self.run_dir)}
            scores = {
                int(r["step"]): float(r["eval/reward_mean"])
                for r in read_metrics(self.run_dir / "metrics.jsonl")
                if isinstance(r.get("eval/reward_mean"), int | float) and "step" in r
            }
            if "eval/reward_mean" in evals:
                scores[self.step] = float(evals["eval/reward_mean"])
            ranked = [(score, step) for step, score in scores.items() if step in saved and math.isfinite(score)]
            if ranked:
                keep.add(max(ranked)[1])  # a tie keeps the later step
        prune_checkpoints(self.run_dir, keep_last=self.t.keep_checkpoints, keep_steps=keep)

    async def _resume(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise ConfigError(
                f"trainer.resume=true but {self.run_dir / 'checkpoints'} holds no complete "
                "checkpoint; set run_dir to the run to resume"
            )
        await self.policies.load(ckpt.state)
        self.gateway.set_sampler(self._sampler())  # a fleet gets the restored weights in run()
        for name, backend in self.policies:
            if name != self.gateway.policies.default:
                self.gateway.set_sampler(backend.sampler, policy=name)
        self.order.restore(ckpt.state["data"])
        self.step = ckpt.step
        self._resumed = resumed_pool(ckpt.state.get("async"), ckpt, mode=self.t.mode, batch_size=self.t.batch_size)
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
        batch, group = self.t.batch_size, self.t.group_size
        step, index = divmod(seq, batch)
        base = (self.cfg.seed * 1_000_003 + step * 65_537) % (2**62)
        return session_sampling(self.policy_algos, evaluation=False, seed=(base + 7_919 * index * group) % (2**63))

    def _versions(self) -> Versions:
        """The weights a step's turns are aged against (staleness, the hard bound): the
        backend's version, or with several policies each policy's, so a policy that did not
        step does not age its turns."""
        return self.policies.versions() if self.policies.several else int(self.backend.weight_version)

    def _start_source(self) -> RolloutSource:
        """The rollout source of ``trainer.mode``: the step's own rollouts, or a running pool."""
        if self.t.mode == "sync":
            return SyncSource(self._rollouts, lambda: self._last_batch)
        batch, group = self.t.batch_size, self.t.group_size
        room = (self.t.max_staleness + 1) * batch
        pool = RolloutPool(
            runner=self.runner,
            rows=self.train_rows,
            order=self.order,
            size=PoolSize(group, max_groups=room, max_rollouts=self.t.max_rollouts_in_flight or room * group),
            sampling=self._group_sampling,
            start=self._resumed,
        )
        pool.start()
        source = PoolSource(
            pool, batch_size=batch,
            version=self._versions, reruns=len(self._resumed.pending),
            exclude_failed=self.algo.exclude_failed,
        )
        self._closers.append(source.aclose)
        return source

    async def _one_step(self, source: RolloutSource) -> dict[str, Any]:
        times = StepTimes()
        t_step = time.perf_counter()
        batch = await source.take()
        times.rollout, self._last_batch, flow = batch.waited, batch.data_indices, batch.flow
        t0 = time.perf_counter()
        # reward=<name>; the agent's own by default. Finished rollouts that will not train
        # (async: dropped groups) are scored and counted too: rollouts/*, reward/* and the
        # failure guard see every finished rollout, not only the ones that train.
        n_trained = len(batch.outcomes)
        scored = await self.rewards.score([*batch.outcomes, *batch.untrained])
        # role_rewards naming no policy of the run fail their rollout, saying so.
        scored = check_role_rewards(scored, self.policies.names)
        outcomes, untrained = scored[:n_trained], scored[n_trained:]
        flow["time/reward"] = time.perf_counter() - t0
        version = self._versions()  # the weights these outcomes train (each policy's, with several)
        statuses = self._check_failures(outcomes + untrained)
        # A turn an agent sampled at its own temperature/top-p/top-k (sampling overrides)
        # is context, never trained as if drawn from the distribution its policy's loss scores.
        trainable, flow["turns/masked_overrides"], flow["tokens/masked_overrides"] = mask_override_turns(
            outcomes, self.loss_samplings
        )
        if self.t.mode == "async" and self.t.max_staleness_per_token >= 0:
            trainable, flow["async/masked_stale_tokens"] = mask_stale_turns(
                trainable, version, self.t.max_staleness_per_token
            )
        signal = self._signal(trainable)
        versions = self.policies.versions()  # the weights each policy's outcomes train
        train_metrics = await self._update(signal, times)
        if self.fleet is not None:
            flow.update(self.fleet.metrics())
        self.step += 1
        source_state = await source.settle(batch)
        saved = bool(self.t.save_every and self.step % self.t.save_every == 0 and self.step < self.t.max_steps)
        if saved:
            times.checkpoint = await self._checkpoint(source_state)
        evals: dict[str, float] = {}
        if self.t.eval_every and self.step % self.t.eval_every == 0:
            t0 = time.perf_counter()
            evals = await self.evaluate()
            times.eval = time.perf_counter() - t0
        if saved:
            self._prune(evals)
        step_time = time.perf_counter() - t_step
        flow.update(source.idle_metrics(batch, step_time))
        record = step_metrics(
            StepReport(
                step=self.step,
                outcomes=outcomes,
                untrained=untrained,
                statuses=statuses,
                datums=signal.datums,
                metrics={**signal.metrics, **train_metrics, **evals},
                times=times,
                step_time=step_time,
                weight_version=int(self.backend.weight_version),
                data={"data/epoch": self.order.epoch, "data/cursor": self.order.cursor, "data/batch": list(self._last_batch)},
            )
        )
        record.update(flow_metrics(outcomes, version, flow, step_time, exclude_failed=self.algo.exclude_failed))
        if self.policies.several:
            record.update(policy_metrics(
                outcomes, signal, versions, self.policies.versions(), exclude_failed=self.algo.exclude_failed
            ))
        record.update(component_metrics(outcomes))
        # The viewer shows each rollout's lag behind the step's version: with several policies
        # there is one per policy, so none is written rather than the default policy's.
        trained_version = version if isinstance(version, int) else None
        record.update(
            await self.traces.awrite_step(self.step, outcomes, signal.advantages, weight_version=trained_version)
        )
        return record

    async def _update(self, signal: StepSignal, times: StepTimes) -> dict[str, float]:
        """Train each policy on its datums in ``signal`` and serve its new weights; a policy
        (the step, with one) without signal skips its update."""
        # Stable keys: a step without a learning signal reports NaN (null in JSON) and
        # skips the update: zero-advantage datums would still move the weights through
        # Adam's momentum and bump the weight version for nothing.
        train_metrics: dict[str, float] = {
            "train/loss": math.nan,
            "train/logprob_diff_max": math.nan,
            "train/skipped": 1.0,
        }
        trained: dict[str, dict[str, float]] = {}
        for name, datums in signal.by_policy().items():
            algo = self.policy_algos.get(name, self.algo)
            # An entropy bonus (loss_config.entropy_coef) is a gradient without advantages,
            # and cross_entropy (supervised) ignores them.
            needs_no_advantage = algo.loss == "cross_entropy" or float(algo.loss_config.get("entropy_coef", 0.0)) > 0
            has_signal = any(a != 0.0 for d in datums for a in d.advantages)
            if not (has_signal or (datums and needs_no_advantage)):
                continue
            backend = self.policies[name] if self.policies.several else self.backend
            if self.fleet is not None:  # sampler.sleep_during_train: the servers free the GPU; the push wakes them
                await self.fleet.before_train()
            t0 = time.perf_counter()
            trained[name] = await self._train(datums, backend, algo)
            times.train += time.perf_counter() - t0
            t0 = time.perf_counter()
            if self.policies.several:
                await backend.sync_sampler()
                self.gateway.set_sampler(backend.sampler, policy=name)
            else:
                self.gateway.set_sampler(await self._sync())
            times.sync += time.perf_counter() - t0
        if not self.policies.several:
            for metrics in trained.values():
                train_metrics.update(metrics)
                train_metrics["train/skipped"] = 0.0
            return train_metrics
        for name, metrics in trained.items():
            train_metrics.update({f"policy/{name}/{k.split('/', 1)[1]}": v for k, v in metrics.items()})
        if trained:
            # The run's train/* over its policies: the mean loss, the largest logprob gap.
            losses = [m["train/loss"] for m in trained.values() if "train/loss" in m]
            gaps = [m["train/logprob_diff_max"] for m in trained.values() if "train/logprob_diff_max" in m]
            train_metrics["train/loss"] = sum(losses) / len(losses) if losses else math.nan
            train_metrics["train/logprob_diff_max"] = max(gaps) if gaps else math.nan
            train_metrics["train/skipped"] = 0.0
        return train_metrics

    def _emit(self, record: dict[str, Any], bar: Any) -> None:
        self.metrics.write(record)
        if self.console:
            line = console_line(record)
            if bar is not None:
                bar.write(line)
            else:
                print(line, flush=True)
        for warning in self.parse_watch.warnings(record):
            if bar is not None:
                bar.write(warning, file=sys.stderr)
            else:
                print(warning, file=sys.stderr, flush=True)

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
            self.source = self._start_source()
            t_run = time.perf_counter()
            await self._train_steps(self.source)
            end: SourceEnd = await self.source.finish()
            final: dict[str, Any] = {"step": self.step, **end.metrics}
            if self.eval_rows and not (self.t.eval_every and self.step % self.t.eval_every == 0):
                final.update(await self.evaluate())
            final["time/train_wall"] = time.perf_counter() - t_run
            await self._checkpoint(end.state)
            self._prune(final)
            self.metrics.write(final)
            write_report(self.run_dir)
            if self.console:
                what = f"task={self.cfg.task.name} backend={self.composed.backend.name}"
                for line in closing_lines(final, what=what, run_dir=self.run_dir, has_eval=bool(self.eval_rows)):
                    print(line, flush=True)
            return 0
        finally:
            await self._teardown()

    async def _train_steps(self, source: RolloutSource) -> None:
        """Steps until ``trainer.max_steps``, each record written as it is made."""
        if self.console and self.step < self.t.max_steps:
            print(CONSOLE_LEGEND, flush=True)
        bar = None
        if self.t.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.t.max_steps, initial=self.step, desc="train", disable=None, file=sys.stderr)
        try:
            while self.step < self.t.max_steps:
                record = await self._one_step(source)
                self._emit(record, bar)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{record['reward/mean']:.3f}")
        finally:
            if bar is not None:
                bar.close()


def run_training(cfg: DictConfig, plugins: Plugins) -> int:
    """Run the loop described by ``cfg`` to completion; returns an exit code."""
    return asyncio.run(Trainer(cfg, plugins).run())

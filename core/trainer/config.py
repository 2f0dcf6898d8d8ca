"""Config schemas of a training run: the root ``TrainConfig`` and its ``trainer``,
``algorithm``, ``task`` and ``policies`` sections.

Hydra type-checks overrides against these dataclasses (stored as ``base_train`` by
``core.config.register_configs``). ``load_train_config(cfg)`` turns the composed
config into ``TrainConfig``: the schema's dataclasses, whose ``__post_init__`` checks
run, then ``validate``, the checks that span groups; so a bad setting is refused
before anything starts. The sections plugins own (``backend``, ``runtime``,
``reward``) stay the composed ``DictConfig`` nodes. Also defines ``check_loss_config`` and
``policy_routes`` (the gateway's routing table from ``policies``); a policy's own settings
are ``core.trainer.policy_config``'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, OmegaConf

from core.algo.advantages import STD_KINDS
from core.algo.losses import parse_loss_spec
from core.errors import ConfigError
from core.eval.config import EvalConfig
from core.gateway.config import GatewayConfig
from core.gateway.policies import PolicyRoutes
from core.rollout.outcome import check_exclude_on
from core.trainer.fleet import SamplerConfig
from core.trainer.policy_config import PolicyConfig, policy_algorithm, read_policies
from core.trainer.signal import TOKEN_MEAN_OVER

ASYNC_TIS_CAP = 2.0
"""``algorithm.tis_cap`` when not set in ``trainer.mode=async`` (docs/architecture.md)."""

MODES = ("sync", "async")
"""``trainer.mode`` choices."""

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
"""``algorithm.loss`` choices of core's loop."""

_Section = TypeVar("_Section")

POLICY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""What a policy name may be: it names metrics and checkpoint folders later on."""

_CLIP_KEYS = ("clip_low", "clip_high", "clip_low_threshold", "clip_high_threshold")
_UNCLIPPED_LOSSES = ("cross_entropy", "importance_sampling")


def check_loss_config(loss: str, loss_config: Mapping[str, Any] | Any) -> None:
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


@dataclass
class TrainerConfig:
    """How long and how big each step is, and the run's guards."""

    max_steps: int = 300
    """Optimizer steps to run (a resumed run continues up to this count)."""
    batch_size: int = 16
    """Prompts (dataset rows) per step."""
    group_size: int = 16
    """Rollouts per prompt (the GRPO group size K)."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end, when an eval set is given)."""
    eval_size: int = 64
    """Most eval rows per evaluation."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    resume: bool = False
    """Continue from the last checkpoint in ``run_dir``."""
    max_failure_rate: float = 0.5
    """Abort when more than this fraction of a step's rollouts fail."""
    exclude_on: list[str] = field(
        default_factory=lambda: ["sampler_error", "in_flight", "aborted"]
    )
    """Gateway faults that exclude a rollout the agent called ok (status
    ``sampler_error``, out of the group baseline, counted in ``rollouts/sampler_error``):
    ``sampler_error`` (a model call failed), ``in_flight`` (a call was still being
    generated when the agent returned), ``aborted`` (the sampler aborted a call),
    ``disconnected`` (the client dropped a call; off by default: the trace holds what
    the agent received). ``[]`` trains every rollout the agent called ok."""
    max_abs_reward: float = 1e9
    """Rewards larger in magnitude are ``invalid_reward`` (sentinels such as 1e200 or
    -sys.maxsize would swamp their group's statistics)."""
    canary: bool = True
    """Run one rollout before training to prove the agent reaches the gateway."""
    rollout_timeout_s: float = 120.0
    """Deadline of one rollout."""
    max_concurrent_rollouts: int = 256
    """Most rollouts in flight at once."""
    progress: bool = True
    """Show progress bars."""
    mode: str = "sync"
    """``sync``: each step runs its rollouts, then trains on them (the sampler idles
    while the trainer works and vice versa). ``async``: rollouts run continuously and
    a step trains on the first ``batch_size`` groups that finish within
    ``max_staleness`` (see docs/architecture.md, "Asynchronous training")."""
    max_staleness: int = 1
    """``mode=async``: the pool's room, bounding staleness at admission: at most
    ``(max_staleness + 1) * batch_size`` groups are started and not yet trained. Every
    group that finishes trains, none is dropped; a straggler may be older than this,
    and its tokens are corrected by the importance weight (``algorithm.tis_cap``).
    0 trains on-policy, as ``sync`` does."""
    max_staleness_per_token: int = -1
    """``mode=async``: optional hard bound (-1: off). Turns generated more than this many
    optimizer steps before the weights being trained become context (loss weight 0);
    the group and its advantage stay (``async/masked_stale_tokens``)."""
    max_rollouts_in_flight: int = 0
    """``mode=async``: most training rollouts started and not yet finished (a multiple
    of ``group_size`` is used); 0: ``(max_staleness + 1) * batch_size * group_size``,
    the most the staleness bound can use. Rollouts past ``max_concurrent_rollouts``
    wait for a slot (and sample whatever weights are current when they start)."""
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: console, jsonl, and wandb / tensorboard when installed."""
    save_traces: int = 1
    """Store every N-th step's rollouts (conversation, token ids, loss mask, logprobs,
    weight versions, reward, status, advantage) under ``<run_dir>/traces/`` for
    ``python -m core.view``; evaluations are stored whenever it is > 0; 0 stores none
    (docs/viewer.md gives the size per 1,000 rollouts)."""
    keep_traces: int = 100
    """Most training steps whose traces are kept: older files are deleted as new ones are
    written, so a long run's ``traces/`` stays bounded; 0 keeps all. Evaluations are all kept."""
    keep_checkpoints: int = 3
    """Most recent checkpoints kept: older ones are deleted after each save (a real
    model's full state is tens of GB each); 0 keeps all. More than one leaves a resume
    something to fall back to when the newest is torn."""
    keep_best_checkpoint: bool = True
    """Also keep the checkpoint of the step with the best ``eval/reward_mean`` (an
    evaluation at a step that saved one: align ``eval_every`` with ``save_every``)."""

    def __post_init__(self) -> None:
        """Refuse sizes, guards and async settings core's loop cannot run with."""
        if self.batch_size < 1 or self.group_size < 1:
            raise ConfigError("trainer.batch_size and trainer.group_size must be >= 1")
        if isinstance(self.keep_checkpoints, bool) or int(self.keep_checkpoints) < 0:
            raise ConfigError(
                f"trainer.keep_checkpoints={self.keep_checkpoints!r} must be 0 (keep all) or the "
                "number of recent checkpoints to keep"
            )
        check_exclude_on(self.exclude_on)
        if self.mode not in MODES:
            raise ConfigError(f"trainer.mode={self.mode!r}; use sync or async")
        if int(self.max_staleness_per_token) < -1:
            raise ConfigError(
                f"trainer.max_staleness_per_token={self.max_staleness_per_token!r} must be -1 (off) "
                "or an integer >= 0 (optimizer steps)"
            )
        staleness = self.max_staleness
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ConfigError(
                f"trainer.max_staleness={staleness!r} must be an integer >= 0 (optimizer steps; "
                "0 trains on-policy)"
            )
        in_flight, group = int(self.max_rollouts_in_flight), int(self.group_size)
        if in_flight < 0 or 0 < in_flight < group:
            raise ConfigError(
                f"trainer.max_rollouts_in_flight={in_flight} must be 0 (as many as the staleness "
                f"bound allows) or at least trainer.group_size={group} (a group runs all at once)"
            )
        max_abs = float(self.max_abs_reward)
        if not (max_abs > 0 and math.isfinite(max_abs)):
            raise ConfigError(f"trainer.max_abs_reward must be a finite number > 0, got {max_abs!r}")


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the loss (GRPO by default)."""

    name: str = "grpo"
    """Algorithm name (informational)."""
    loss: str = "ppo"
    """Loss passed to ``forward_backward``: cross_entropy, importance_sampling, ppo or cispo."""
    loss_config: dict[str, float] = field(default_factory=dict)
    """Loss settings forwarded to the backend; empty means each loss's own clip range
    (``core.algo.losses.CLIP_DEFAULTS``: ppo 0.2/0.2, cispo upper side only)."""
    normalize_std: bool = True
    """Divide group-centred rewards by the group's standard deviation."""
    exclude_failed: bool = True
    """Drop failed rollouts from their group instead of scoring them 0.0 (with
    ``false``, only failed rollouts that have trace rows are scored 0.0 and trained;
    one without rows has nothing to push down and stays out, as in verl and slime)."""
    std: str = "population"
    """Standard deviation that ``normalize_std`` divides by: ``population`` (divide
    the squared deviations by n) or ``sample`` (by n - 1, verl's GRPO)."""
    token_mean_over: str = "batch"
    """Denominator of the token-level mean: ``batch`` (every generated token of the
    step's successful rollouts; groups without signal add zero-advantage tokens, so a
    step with few informative groups takes a proportionally small step) or
    ``trained`` (only tokens with an advantage; cheaper on remote backends)."""
    learning_rate: float = 1e-3
    """Adam step size."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.999
    """Adam beta2."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    grad_clip_norm: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    temperature: float = 1.0
    """Sampling temperature during training rollouts."""
    eval_temperature: float = 0.0
    """Sampling temperature during evaluation."""
    max_tokens: int = 8
    """Most tokens the model may generate per turn."""
    tis_cap: float | None = None
    """Truncated importance weight: a token's weight ``pi_trainer / pi_sampler`` in the
    gradient is capped at this value (0: no cap). Sent to the backend as
    ``loss_config.tis_cap``; the local backend applies it, Tinker and SageMaker refuse it.
    Not set: ``ASYNC_TIS_CAP`` in ``trainer.mode=async`` with a ratio loss on a backend that
    applies it (``truncates_importance_weights``), else 0."""

    def __post_init__(self) -> None:
        """Refuse a loss, loss settings or advantage options no backend can train with."""
        if self.loss not in LOSSES:
            raise ConfigError(
                f"algorithm.loss={self.loss!r}; use cross_entropy, importance_sampling, ppo or cispo"
            )
        check_loss_config(str(self.loss), self.loss_config)
        if self.token_mean_over not in TOKEN_MEAN_OVER:
            raise ConfigError(f"algorithm.token_mean_over={self.token_mean_over!r}; use batch or trained")
        if self.std not in STD_KINDS:
            raise ConfigError(
                f"algorithm.std={self.std!r}; use population (divide by n) or sample (by n - 1)"
            )
        cap = float(self.tis_cap or 0.0)
        if not (cap == 0.0 or (cap >= 1.0 and math.isfinite(cap))):
            raise ConfigError(
                f"algorithm.tis_cap={cap!r} must be 0 (off) or a finite number >= 1 (a cap below 1 "
                "would also shrink on-policy tokens, whose weight is 1)"
            )
        if cap and self.loss == "cross_entropy":
            raise ConfigError(
                "algorithm.tis_cap truncates the importance weight pi_trainer / pi_sampler, but "
                "algorithm.loss=cross_entropy has none; drop algorithm.tis_cap or use "
                "importance_sampling, ppo or cispo"
            )


@dataclass
class TaskConfig:
    """The data and the agent that turns a payload into a reward."""

    name: str = "succ_digit"
    """Task name (informational)."""
    train_path: str = ""
    """JSONL or Parquet file with a ``payload`` field/column; empty uses ``generator``."""
    eval_path: str = ""
    """Optional eval set, same format."""
    generator: str = ""
    """``module:function`` that writes the data set when no path is given (toy tasks)."""
    generator_kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments passed to ``generator``."""
    agent: str = ""
    """The agent app as ``module:attribute`` (an ``core.agent.AgentApp``)."""
    agent_env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for agent processes."""
    tokenizer_corpus: str = ""
    """``module:function`` returning the texts a tokenizer built from scratch (the local
    backend's ``tiny`` model) is trained on; empty uses core.tokenizer's default corpus."""
    tokenizer_vocab_size: int = 0
    """Vocabulary size of that tokenizer; 0 uses core.tokenizer's default."""
    tokenizer_tokens: str = ""
    """``module:function`` returning texts that tokenizer keeps whole, one token each
    (a task's fixed tools block and tool calls); empty: none."""


def policy_routes(policies: Mapping[str, PolicyConfig]) -> PolicyRoutes:
    """The gateway's routing table for ``policies``: one ``DEFAULT_POLICY`` when empty, else
    the policies in the order given (the first is the sessions' default).

    Raises:
        ConfigError: a policy name that is not a plain identifier, or a model name routed to
            two policies (or to one policy while naming another).
    """
    if not policies:
        return PolicyRoutes()
    names = tuple(str(name) for name in policies)
    bad = [n for n in names if not POLICY_NAME.match(n)]
    if bad:
        raise ConfigError(
            f"policies has names {bad!r}; a policy name is 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    models: dict[str, str] = {}
    for name, policy in policies.items():
        for model in policy.models:
            if not isinstance(model, str) or not model:
                raise ConfigError(f"policies.{name}.models must be non-empty model names, got {model!r}")
            owner = models.get(model) or (model if model in names and model != name else None)
            if owner is not None and owner != name:
                raise ConfigError(
                    f"model name {model!r} is routed to both policies {owner!r} and {name!r}; "
                    "each model name routes to one policy (a policy answers to its own name too)"
                )
            models[model] = str(name)
    return PolicyRoutes(names=names, models=models)


@dataclass
class TrainConfig:
    """Schema of the composed config of ``python -m core.train``."""

    seed: int = 0
    """Seed for data order, sampling and model initialisation."""
    run_dir: str = MISSING
    """Where metrics, checkpoints and the report go (default under ``outputs/``)."""
    backend: Any = MISSING
    """The ``backend/<name>`` node a plugin registered; has at least ``name``."""
    runtime: Any = MISSING
    """The ``runtime/<name>`` node; has at least ``name``."""
    reward: Any = MISSING
    """The ``reward/<name>`` node (``core.rewards.RewardConfig`` fields at least)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and loss."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Data and agent."""
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    """The token-capturing gateway."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop length, sizes and guards."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Who samples: the backend (default) or a vLLM/SGLang fleet (``sampler=sglang``)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """``python -m core.eval`` settings (docs/eval.md)."""
    policies: dict[str, Any] = field(default_factory=dict)
    """The policies the gateway routes turns to by their request's ``model``, by name, each a
    ``PolicyConfig`` (its own learning rate, loss and sampling over ``algorithm``'s) once
    ``load_train_config`` has read it (the schema keeps a plain mapping: OmegaConf refuses
    ``+policies.<name>=...`` into a typed one, and pydantic checks each entry). Empty: one policy,
    ``core.types.DEFAULT_POLICY``, as a run with no sub-agents needs. More than one needs a
    backend that declares ``multi_policy`` (local; docs/multi_agent.md)."""


def _section(node: Any, schema: type[_Section]) -> _Section:
    """``node`` as an instance of ``schema`` (its ``__post_init__`` runs)."""
    if not (isinstance(node, DictConfig) and OmegaConf.get_type(node) is schema):
        node = OmegaConf.merge(OmegaConf.structured(schema), node)
    obj = OmegaConf.to_object(node)
    assert isinstance(obj, schema)
    return obj


def load_train_config(cfg: DictConfig) -> TrainConfig:
    """The composed config as ``TrainConfig``, checked; a bad setting raises ``ConfigError``.

    ``algorithm``, ``task``, ``gateway``, ``trainer``, ``sampler`` and ``eval`` become
    their dataclasses; ``backend``, ``runtime`` and ``reward`` stay the composed nodes
    (plugins own their schemas).
    """
    typed = TrainConfig(
        seed=int(cfg.seed),
        run_dir=str(cfg.run_dir),
        backend=cfg.backend,
        runtime=cfg.runtime,
        reward=cfg.get("reward"),
        algorithm=_section(cfg.algorithm, AlgorithmConfig),
        task=_section(cfg.task, TaskConfig),
        gateway=_section(cfg.gateway, GatewayConfig),
        trainer=_section(cfg.trainer, TrainerConfig),
        sampler=_section(cfg.get("sampler") or {}, SamplerConfig),
        eval=_section(cfg.get("eval") or {}, EvalConfig),
        policies=read_policies(cfg.get("policies")),
    )
    validate(typed)
    return typed


def validate(cfg: TrainConfig) -> None:
    """The checks that read more than one group (each group checks itself in ``__post_init__``).

    ``reward`` is a plugin's node without a schema here, so its ``timeout_s``, which the
    loop's rollout runner waits with, is checked at the root.
    """
    policy_routes(cfg.policies)
    for name, policy in cfg.policies.items():  # each policy's algorithm is checked as the run's
        policy_algorithm(cfg.algorithm, name, policy)
    if cfg.sampler.sleep_during_train and (cfg.sampler.kind == "backend" or cfg.trainer.mode != "sync"):
        why = (
            "sampler=backend has no inference servers to put to sleep"
            if cfg.sampler.kind == "backend"
            else f"in trainer.mode={cfg.trainer.mode!r} the servers sample while the trainer trains"
        )
        raise ConfigError(
            f"sampler.sleep_during_train=true: {why}; use it with sampler=vllm|sglang and "
            "trainer.mode=sync, or set sampler.sleep_during_train=false (docs/samplers.md)"
        )
    timeout = cfg.reward.get("timeout_s") if isinstance(cfg.reward, DictConfig) else None
    if timeout is not None and not (float(timeout) >= 0 and math.isfinite(float(timeout))):
        raise ConfigError(f"reward.timeout_s must be a finite number >= 0, got {float(timeout)!r}")

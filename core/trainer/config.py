"""Config schemas of the training loop: ``trainer``, ``algorithm`` and ``task``.

Hydra type-checks overrides against these dataclasses (stored as
``base_train`` by ``core.config.register_configs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    """``mode=async``: how many optimizer steps older than the weights being trained a
    group's oldest generated token may be; older groups are dropped and counted
    (``async/dropped_stale``). 0 trains on-policy, as ``sync`` does."""
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
    tis_cap: float = 0.0
    """Truncated importance weight: a token's weight ``pi_trainer / pi_sampler`` in the
    gradient is capped at this value (0: no cap). Sent to the backend as
    ``loss_config.tis_cap``; the local backend applies it, Tinker and SageMaker refuse it."""


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

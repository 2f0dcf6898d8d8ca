"""The ``eval`` config section of ``python -m core.eval`` (also in ``core.train``'s schema)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EvalConfig"]


@dataclass
class EvalConfig:
    """What to evaluate, against which model, how many samples."""

    checkpoint: str = ""
    """A checkpoint directory (``<run_dir>/checkpoints/step_N``) or a run directory (its
    latest checkpoint), loaded into the backend and served by its sampler; the run's own
    overrides (``<run_dir>/tracerl_run.yaml``) are applied first. Empty: the backend's
    base model (unless ``endpoint`` is set)."""
    endpoint: str = ""
    """An OpenAI-compatible base URL (``https://.../v1``) the agent calls directly, for
    baselines: no backend, no gateway, no trace capture (token counts are 0)."""
    model: str = ""
    """Model name the agent sends to ``endpoint`` (required with it)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key sent to ``endpoint`` (unset: ``EMPTY``)."""
    allow_plain_http: bool = False
    """Send the key to a plain-http ``endpoint`` that is not loopback (in clear text); by
    default a key goes only over https or to loopback."""
    data: str = ""
    """Eval set (JSONL or Parquet with a ``payload`` field); empty: ``task.eval_path``, or
    the one the task's generator writes."""
    limit: int = 0
    """Evaluate only the first N rows (0: all)."""
    samples_per_prompt: int = 1
    """Rollouts per eval row; pass@k and mean@k are reported for k = 1, 2, 4, ... up to it."""
    temperature: float = 0.0
    """Sampling temperature (0: greedy; use > 0 with samples_per_prompt > 1)."""
    max_tokens: int = 0
    """Most tokens per model turn; 0: ``algorithm.max_tokens``."""
    concurrency: int = 64
    """Most rollouts in flight at once."""
    pass_threshold: float = 1.0
    """A sample passes (for pass@k) when it is ok with reward >= this."""
    output_dir: str = ""
    """Where ``results.jsonl`` and ``summary.json`` go; empty: ``run_dir``."""
    progress: bool = True
    """Show a progress bar on stderr."""

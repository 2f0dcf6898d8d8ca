"""Config schema of the built-in ``local`` runtime (and the agent server settings that
``runtime=ray`` passes to each actor's local pool)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AgentServerSettings:
    """How agent server processes run and report results: the same under ``runtime=local``
    and inside each ``runtime=ray`` actor (one definition, so the two cannot drift)."""

    python: str = ""
    """Interpreter for agent processes; empty uses the one running the runtime (the
    trainer's under ``runtime=local``, the actor's on a Ray node)."""
    max_restarts: int = 10
    """Restarts allowed per agent process before it is left dead (per actor under ``runtime=ray``)."""
    result_channel: str = "http"
    """``http`` (start/get polling) or ``s3`` (agentcore-rl-toolkit ``AgentCoreRLApp`` results)."""
    poll_interval_s: float = 0.05
    """First polling interval for servers that cannot long-poll (grows to 1 s)."""
    s3_bucket: str = ""
    """Bucket for ``result_channel=s3``."""
    s3_endpoint_url: str = ""
    """S3 endpoint for ``result_channel=s3``; empty uses the AWS default/environment."""
    s3_exp_id: str = "tracerl"
    """Experiment prefix of result keys (``{exp_id}/{group_id}/{session_id}.json``)."""
    pass_env: list[str] = field(default_factory=list)
    """Names (``*`` globs) of the trainer's environment variables agent processes also get.
    By default an agent sees only an allowlist (``PATH``, ``HOME``, ``LANG``/``LC_*``,
    ``TMPDIR``, ``PYTHONPATH``, ``VIRTUAL_ENV``... see ``core/runtime/_agent_env.py``),
    the ``AWS_*`` credentials with ``result_channel=s3``, and ``task.agent_env``: never
    the judge key, cloud or W&B credentials (docs/security.md)."""


@dataclass
class LocalRuntimeConfig(AgentServerSettings):
    """Agent app served by a pool of local processes."""

    name: str = "local"
    """Runtime name."""
    num_processes: int = 2
    """Agent server processes; each serves many sessions concurrently."""
    max_concurrency: int = 256
    """Most rollouts in flight across all processes."""
    startup_timeout_s: float = 60.0
    """How long a process may take to answer ``/ping``."""
    host: str = "127.0.0.1"
    """Address agent servers bind (loopback: only this machine reaches them)."""
    workdir: str = ""
    """Folder for process logs and per-session directories; empty makes a temporary one."""
    keep_workdirs: bool = False
    """Keep each session's directory after its rollout (for debugging agents)."""

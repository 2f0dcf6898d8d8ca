"""Config schema of the built-in ``local`` runtime."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LocalRuntimeConfig:
    """Agent app served by a pool of local processes."""

    name: str = "local"
    """Runtime name."""
    num_processes: int = 2
    """Agent server processes; each serves many sessions concurrently."""
    max_concurrency: int = 256
    """Most rollouts in flight across all processes."""
    startup_timeout_s: float = 60.0
    """How long a process may take to answer ``/ping``."""
    python: str = ""
    """Interpreter for agent processes; empty uses the trainer's."""

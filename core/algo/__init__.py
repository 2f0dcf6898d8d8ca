"""Pure RL maths on plain data: group advantages and datum building."""

from __future__ import annotations

from core.algo.advantages import GroupStats, RolloutScore, compute_group_advantages
from core.algo.datums import trace_to_datum

__all__ = ["GroupStats", "RolloutScore", "compute_group_advantages", "trace_to_datum"]

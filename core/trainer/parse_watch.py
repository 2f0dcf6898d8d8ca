"""Tool-call parse statuses per step, for the training loop: ``core.gateway.parse_watch``.

Re-exported here, where the loop and its tests import them; they live with the gateway, which
records the statuses, so ``python -m core.eval`` (a layer below the trainer) reports them too.
"""

from __future__ import annotations

from core.gateway.parse_watch import JUMP_FACTOR, JUMP_FLOOR, ParseWatch, parse_metrics

__all__ = ["JUMP_FACTOR", "JUMP_FLOOR", "ParseWatch", "parse_metrics"]

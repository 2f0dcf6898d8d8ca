"""A stored training step with a turn a weight update interrupted, for the viewer tests.

The turn is recorded by the real gateway from a sampler that answers with two
segments (versions 3 then 4, as the local sampler does when a weight sync lands
mid-generation; that sampler is tested in plugins/local/tests/test_interrupt.py),
and stored with the real trace writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.gateway import Gateway, GatewayConfig
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.rundir.traces import TraceWriter, conversation_tree
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SampleResult,
    SamplingParams,
    Segment,
)

SPLIT = 3
"""Tokens of the reply sampled before the weight update."""
OLD, NEW = 3, 4
"""The two segments' weight versions."""


class _InterruptedSampler:
    def __init__(self, tok: Any) -> None:
        self.tok = tok

    async def sample(self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str) -> SampleResult:
        ids = [*self.tok.encode("hello there", add_special_tokens=False), self.tok.eos_token_id]
        return SampleResult(ids, [-0.5] * SPLIT + [-2.0] * (len(ids) - SPLIT), FinishReason.STOP, OLD,
                            segments=(Segment(0, SPLIT, OLD), Segment(SPLIT, len(ids), NEW)))


def write_segment_step(run_dir: Path, tok: Any, step: int = 1) -> None:
    """Store one rollout (id ``r-seg``) whose only turn has the two segments as ``step``."""
    gw = Gateway(tokenizer=tok, sampler=_InterruptedSampler(tok), config=GatewayConfig())

    async def go() -> Any:
        sid = gw.create_session(sampling=SamplingParams(max_tokens=64))
        await gw.run_turn(sid, TurnRequest(units=openai_units([{"role": "user", "content": "hi"}])))
        session = gw.session(sid)
        conversation = conversation_tree(session.root, session.turns)
        return SimpleNamespace(
            request=RolloutRequest("r-seg", "g0", {"q": "hi"}, "http://x/v1", sid, "m"),
            result=RolloutResult("r-seg", RolloutStatus.OK, reward=1.0, elapsed_s=1.0),
            rows=gw.finish_session(sid), faults={"model_turns": 1}, conversation=conversation,
        )

    outcome = asyncio.run(go())
    TraceWriter(run_dir, 1, decode=lambda ids: f"t{ids[0]} ").write_step(step, [outcome], {}, weight_version=NEW + 1)
    (run_dir / "metrics.jsonl").touch()

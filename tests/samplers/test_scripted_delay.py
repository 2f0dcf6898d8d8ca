"""The scripted sampler's spread latency: what benchmarks/gateway.py's ramp subtracts from each turn."""

from __future__ import annotations

import asyncio
import time

from core.samplers import ScriptedSampler
from core.samplers.scripted import spread_delay
from core.types import SamplingParams


def test_spread_delay_stays_in_its_bounds_and_spreads_over_them() -> None:
    values = [spread_delay(n, 0.2, 5.0) for n in range(1000, 3000)]
    assert all(0.2 <= v <= 5.0 for v in values)
    assert min(values) < 0.3 and max(values) > 4.0  # log-uniform: both ends are reached
    assert spread_delay(1234, 0.2, 5.0) == spread_delay(1234, 0.2, 5.0)
    assert spread_delay(7, 0.5, 0.5) == 0.5


def test_a_pair_of_delays_sleeps_what_spread_delay_says_for_the_prompt() -> None:
    sampler = ScriptedSampler(default=[1, 2], delay_s=(0.05, 0.2), record_calls=False)
    prompt = list(range(40))
    want = spread_delay(len(prompt), 0.05, 0.2)
    t0 = time.perf_counter()
    asyncio.run(sampler.sample(prompt, SamplingParams(max_tokens=4), session_id="s"))
    assert time.perf_counter() - t0 >= want

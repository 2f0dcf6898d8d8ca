"""Which ``Sample`` class to build: slime's own when slime imports, else the stand-in.

Defines ``Sample``, ``USING_STANDIN`` and ``reward_value``. Importing slime's
``slime.utils.types`` needs torch (present wherever slime runs); a broken
slime install is reported, not silently replaced, unless slime is absent.
"""

from __future__ import annotations

import importlib.util
from typing import Any

if (
    importlib.util.find_spec("slime") is not None
    and importlib.util.find_spec("slime.utils") is not None
):
    from slime.utils.types import Sample  # type: ignore[import-not-found,no-redef]

    USING_STANDIN = False
else:  # slime is not installed here: tests, dry runs, CPU machines
    from tracerl_slime._sample_standin import Sample  # type: ignore[assignment]

    USING_STANDIN = True

__all__ = ["USING_STANDIN", "Sample", "reward_value"]


def reward_value(sample: Any, args: Any) -> float:
    """The scalar reward of ``sample`` (honours ``--reward-key`` like slime does)."""
    value = sample.reward
    key = getattr(args, "reward_key", None)
    if key and isinstance(value, dict):
        value = value[key]
    return float(value) if value is not None else 0.0

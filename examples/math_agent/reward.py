"""GSM8K-style reward: the number after the last ``####`` must equal the ground truth.

Defines ``extract_answer`` and ``gsm8k_reward``. Numbers compare by value, so
``1,000``, ``$1000`` and ``1000.0`` all match ``1000``.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _to_number(text: str) -> float | None:
    match = _NUMBER.search(text.replace(",", "").replace("$", ""))
    return float(match.group()) if match else None


def extract_answer(response: str) -> str | None:
    """The text after the last ``####`` (stripped), or None when the marker is absent."""
    if "####" not in response:
        return None
    return response.rsplit("####", 1)[1].strip() or None


def gsm8k_reward(response: str, ground_truth: str | float) -> float:
    """1.0 when the final answer equals ``ground_truth`` numerically, else 0.0."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    got = _to_number(answer)
    want = _to_number(str(ground_truth))
    if got is None or want is None:
        return 0.0
    return 1.0 if abs(got - want) < 1e-6 else 0.0

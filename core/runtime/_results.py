"""Turn what an agent returned into a ``RolloutResult``.

Defines ``result_from_output`` (a handler's dict, either toolkit shape) and
``extract_reward``. Shared by every runtime so that "missing", "not a number"
and "crashed" mean the same thing whichever channel carried the result.
"""

from __future__ import annotations

import math
from typing import Any

from core.types import RolloutResult, RolloutStatus


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float; None for non-numbers, NaN, infinities and integers
    too large for a float (``float(10**400)`` raises ``OverflowError``)."""
    if not _is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def extract_reward(output: dict[str, Any]) -> tuple[RolloutStatus, float | None, str | None]:
    """Find the reward under ``reward`` (``AgentCoreRuntimeApp``) or ``rewards`` (``AgentCoreRLApp``).

    A list counts by its last element, as the toolkit's consumers do. Strings,
    booleans, NaN and infinities are invalid: a reward that only looks numeric
    is a bug in the agent, and training on a coerced value would hide it.

    Returns:
        ``(status, reward, error)``: ``OK`` with a finite float, or a failed
        status with a message naming the offending value.
    """
    key = "reward" if "reward" in output else "rewards" if "rewards" in output else None
    if key is None:
        return (
            RolloutStatus.NO_REWARD,
            None,
            f"the agent's result has no 'reward' (keys: {sorted(output)!r}); "
            "return {'reward': <float>, 'metrics': {...}}",
        )
    value = output[key]
    if isinstance(value, list | tuple):
        if not value:
            return RolloutStatus.NO_REWARD, None, f"the agent's {key!r} is an empty list"
        value = value[-1]
    if value is None:
        return RolloutStatus.NO_REWARD, None, f"the agent's {key!r} is null"
    number = _finite_float(value)
    if number is None:
        # repr() of a huge int can itself fail (sys.int_info.str_digits_check_threshold)
        big = isinstance(value, int) and not isinstance(value, bool)
        shown = f"an integer of {value.bit_length()} bits" if big else repr(value)
        return (
            RolloutStatus.INVALID_REWARD,
            None,
            f"the agent's {key!r} must be a finite number that fits a float, got {shown:.200}",
        )
    return RolloutStatus.OK, number, None


def _metrics(output: dict[str, Any]) -> dict[str, float]:
    raw = output.get("metrics")
    if not isinstance(raw, dict):
        return {}
    out: dict[str, float] = {}
    for k, v in raw.items():
        number = _finite_float(v)
        if number is not None:
            out[str(k)] = number
    return out


def extract_role_rewards(output: dict[str, Any]) -> tuple[dict[str, float], str | None]:
    """The agent's ``role_rewards`` (``{policy name: finite number}``), or an error naming
    what is wrong with it; ``{}`` when the agent returned none. Which names are policies of
    the run is checked by the loop, which knows them (``core.trainer.credit``)."""
    raw = output.get("role_rewards")
    if raw is None:
        return {}, None
    if not isinstance(raw, dict):
        return {}, (
            f"the agent's 'role_rewards' must map policy names to rewards, got {type(raw).__name__}; "
            "return {'reward': <float>, 'role_rewards': {'<policy>': <float>, ...}}"
        )
    out: dict[str, float] = {}
    for key, value in raw.items():
        number = _finite_float(value)
        if not isinstance(key, str) or number is None:
            big = isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64
            shown = f"an integer of {value.bit_length()} bits" if big else repr(value)
            return {}, (
                f"the agent's 'role_rewards' entry {key!r}: {shown:.200} must be a finite number "
                "under a policy name"
            )
        out[key] = number
    return out, None


def result_from_output(rollout_id: str, output: Any, elapsed_s: float) -> RolloutResult:
    """Map a handler's return value (or a toolkit S3 error record) to a ``RolloutResult``."""
    if not isinstance(output, dict):
        return RolloutResult(
            rollout_id,
            RolloutStatus.NO_REWARD,
            error=f"the agent returned {type(output).__name__}, not a dict with 'reward'",
            elapsed_s=elapsed_s,
        )
    status_code = output.get("status_code")
    if isinstance(status_code, int) and not isinstance(status_code, bool) and status_code >= 400:
        # AgentCoreRLApp's error record: {"status_code": 500, "stop_reason", "traceback"}.
        text = output.get("traceback") or output.get("stop_reason") or "agent failed"
        return RolloutResult(
            rollout_id, RolloutStatus.CRASHED, error=str(text), elapsed_s=elapsed_s
        )
    if output.get("reward_pending") is True and output.get("reward", output.get("rewards")) is None:
        # The reward is posted later (core.gateway.late_rewards); the runner waits for it.
        return RolloutResult(
            rollout_id, RolloutStatus.REWARD_PENDING, metrics=_metrics(output), elapsed_s=elapsed_s
        )
    status, reward, error = extract_reward(output)
    role_rewards, role_error = extract_role_rewards(output)
    if status is RolloutStatus.OK and role_error is not None:
        status, reward, error = RolloutStatus.INVALID_REWARD, None, role_error
    return RolloutResult(
        rollout_id,
        status,
        reward=reward,
        metrics=_metrics(output),
        error=error,
        elapsed_s=elapsed_s,
        role_rewards=role_rewards if status is RolloutStatus.OK else {},
    )


def failed(rollout_id: str, status: RolloutStatus, error: str, elapsed_s: float) -> RolloutResult:
    """A failed result (shorthand used by the runtimes)."""
    return RolloutResult(rollout_id, status, error=error, elapsed_s=elapsed_s)

"""One run of the learning test, healthy or with one thing broken, in its own process.

    python tests/learning/learning_run.py SABOTAGE RUN_DIR [HYDRA_OVERRIDES...]

SABOTAGE is ``none`` or one of ``SABOTAGES``. Each sabotage breaks one thing
a silent bug could break, by patching the real code path (the loop turns
rollouts into datums with ``core.trainer.signal.build_signal``) in this process
only (so test_learning.py can run several variants at once, each in its own
process): the advantage sign, the loss mask, the logprobs the ratio is
computed against, the weight sync, (multi-turn tasks) which turns train and whether the tool
result between them is trained as generated, or (several policies) which policy trains which rows.
Metrics go to ``RUN_DIR/metrics.jsonl``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import core.trainer.signal as signal
from core.plugins import load_plugins
from core.testing.fakes import compose
from core.trainer.loop import Trainer


def _original(owner: Any, name: str) -> Any:
    """``owner.name``; fail loudly if the code path a sabotage breaks has moved."""
    if not hasattr(owner, name):
        raise SystemExit(
            f"sabotage cannot patch {getattr(owner, '__name__', owner)}.{name}: it no longer exists; "
            "update tests/learning/learning_run.py to break the code path that replaced it"
        )
    return getattr(owner, name)


def _patch(owner: Any, name: str, new: Any) -> None:
    _original(owner, name)
    setattr(owner, name, new)


def _negate_advantages() -> list[str]:
    """Every advantage's sign flipped: the policy is pushed away from what scored well."""
    real = _original(signal, "compute_group_advantages")

    def negated(*args: Any, **kwargs: Any) -> Any:
        stats = real(*args, **kwargs)
        stats.advantages = {k: -v for k, v in stats.advantages.items()}
        return stats

    _patch(signal, "compute_group_advantages", negated)
    return []


def _shift_mask() -> list[str]:
    """The loss mask one token late: the first generated token is never trained."""
    real = _original(signal, "trace_to_datum")

    def shifted(record: Any, advantage: float) -> Any:
        datum = real(record, advantage)
        if datum is None:
            return None
        weights = [0.0, *datum.weights[:-1]]
        return replace(datum, weights=weights, advantages=[advantage * w for w in weights])

    _patch(signal, "trace_to_datum", shifted)
    return []


def _second_turn_untrained() -> list[str]:
    """Every turn after a row's first gets no weight and no advantage (multi-turn tasks:
    the answer after a tool result is never trained)."""
    real = _original(signal, "trace_to_datum")

    def first_turn_only(record: Any, advantage: float) -> Any:
        datum = real(record, advantage)
        if datum is None or len(record.turns) < 2:
            return datum
        cut = record.turns[1].start - 1  # datum position i scores token i + 1
        weights = [w if i < cut else 0.0 for i, w in enumerate(datum.weights)]
        return replace(datum, weights=weights, advantages=[advantage * w for w in weights])

    _patch(signal, "trace_to_datum", first_turn_only)
    return []


def _tool_result_trained() -> list[str]:
    """The tokens between a row's turns (the tool result and the template around it) are
    trained as if the model had generated them: loss mask 1 there, with the advantage of the
    rollout and the 0.0 sampler logprob the row holds for them (multi-turn tasks)."""
    real = _original(signal, "trace_to_datum")

    def tool_result_trained(record: Any, advantage: float) -> Any:
        if len(record.turns) < 2:
            return real(record, advantage)
        mask = list(record.loss_mask)
        for before, after in zip(record.turns, record.turns[1:], strict=False):
            mask[before.end : after.start] = [1] * (after.start - before.end)
        return real(replace(record, loss_mask=mask), advantage)

    _patch(signal, "trace_to_datum", tool_result_trained)
    return []


def _mismatched_logprobs() -> list[str]:
    """Sampler logprobs at T=1, trainer logprobs at T=0.7: ratios far from 1, clipped away."""
    return ["+algorithm.loss_config.temperature=0.7"]


def _no_weight_sync() -> list[str]:
    """The sampler keeps serving the initial weights."""
    from tracerl_local.backend import LocalBackend

    async def stale(self: Any) -> Any:
        return self.sampler

    _patch(LocalBackend, "sync_sampler", stale)
    return []


def _swapped_policies() -> list[str]:
    """Each policy trains on the rows the other sampled (several policies): the datums of
    ``up`` go to ``down``'s backend and back, as a loop that mixed up its policies would."""
    real = _original(signal, "datums_by_policy")

    def swapped(datums: Any, policies: Any) -> Any:
        grouped = real(datums, policies)
        names = list(grouped)
        return {name: grouped[names[(i + 1) % len(names)]] for i, name in enumerate(names)}

    _patch(signal, "datums_by_policy", swapped)
    return []


SABOTAGES: dict[str, Callable[[], list[str]]] = {
    "negated-advantages": _negate_advantages,
    "shifted-mask": _shift_mask,
    "mismatched-logprobs": _mismatched_logprobs,
    "no-weight-sync": _no_weight_sync,
    "second-turn-untrained": _second_turn_untrained,
    "tool-result-trained": _tool_result_trained,
    "swapped-policies": _swapped_policies,
}


PARENT_ENV = "TRACERL_LEARNING_RUN_PARENT"


def _exit_with_parent() -> None:
    """Exit once the test session that started this run is gone.

    test_learning's runs overlap the whole session; a session killed without its cleanup
    (SIGKILL, a CI timeout) would otherwise leave them training for minutes.
    """
    pid = int(os.environ.get(PARENT_ENV) or 0)
    if not pid:
        return

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(2.0)
        os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    sabotage, run_dir, *overrides = argv
    _exit_with_parent()
    if sabotage != "none" and sabotage not in SABOTAGES:
        print(f"unknown sabotage {sabotage!r}; use none or one of {sorted(SABOTAGES)}", file=sys.stderr)
        return 2
    extra = SABOTAGES[sabotage]() if sabotage != "none" else []
    plugins = load_plugins()
    cfg = compose(
        [
            f"run_dir={run_dir}",
            "trainer.progress=false",
            "trainer.loggers=[jsonl]",
            *overrides,
            *extra,
        ],
        plugins,
    )
    return asyncio.run(Trainer(cfg, plugins).run())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

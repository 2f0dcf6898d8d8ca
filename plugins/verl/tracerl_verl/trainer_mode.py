"""verl trainer mode ``tracerl_sync``: one optimizer step per batch, whatever the rows per rollout.

Defines ``TracerlSyncTrainer`` (registered with verl's ``register_trainer``
when verl imports ``tracerl_verl.verl_ext``).

Why: a tracerl rollout yields a varying number of trace rows (forks,
sub-agents). verl's sync trainer splits a batch into mini-batches of
``ppo_mini_batch_size * rollout.n`` *rows* and pads the batch up to a
multiple of that, so more rows would mean more optimizer steps (and padding
rows). Here the whole batch, padded only to the data-parallel size, is one
mini-batch: ``ppo_epochs`` optimizer steps per batch, as in tracerl's own
loop. With verl's ``token-mean`` (the default, core's
``token_mean_over=batch``) the loss is then one mean over every generated
token of the batch, as in core: a forked rollout adds tokens, each weighing
as much as any other.

The override swaps two settings of the driver's config copy for the length
of one call (verl reads them there); nothing else of verl changes. Asserted
against verl 0.9.1's ``PPOTrainer._update_actor`` and
``_get_required_batch_multiple``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import transfer_queue as tq
from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from tracerl_verl.rows import batch_parse_metrics

MODE = "tracerl_sync"


@contextmanager
def whole_batch_minibatch(config: Any, rows: int) -> Iterator[None]:
    """Make ``ppo_mini_batch_size * rollout.n`` equal ``rows`` while the block runs."""
    actor = config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    saved = (actor.ppo_mini_batch_size, rollout.n)
    with open_dict(config):
        actor.ppo_mini_batch_size = rows
        rollout.n = 1
    try:
        yield
    finally:
        with open_dict(config):
            actor.ppo_mini_batch_size, rollout.n = saved


@register_trainer(MODE)
class TracerlSyncTrainer(PPOTrainerSync):
    """verl's sync trainer with one mini-batch per batch (see the module docstring)."""

    optimizer_steps = 0
    """Calls of ``_update_actor`` (each is ``ppo_epochs`` optimizer steps); for tests and logs."""

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        # no mini-batch alignment: pad only to the data-parallel size
        return dp_size

    def _update_actor(self, batch: Any, metrics: dict[str, Any]) -> Any:
        rows = len(batch)
        with whole_batch_minibatch(self.config, rows):
            out = super()._update_actor(batch, metrics)
        type(self).optimizer_steps += 1
        metrics["tracerl/rows_per_update"] = float(rows)
        # Each turn's tool-call parse status, as core's loop reports them per step.
        metrics.update(batch_parse_metrics(_parse_entries(batch)))
        return out


def _parse_entries(batch: Any) -> list[Any]:
    """Each row's ``tracerl_parse`` entry. verl's V1 trainer hands ``_update_actor`` only
    the batch's keys (``KVBatchMeta``); the rows' ``extra_fields`` are read back from its
    transfer queue, as verl's own trainer does for its rollout metrics."""
    if not len(batch):
        return []
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    return [e.get("tracerl_parse") if isinstance(e, dict) else None for e in list(data["extra_fields"])]

"""slime tier of the parity check: ``core.testing.parity`` through the slime plugin's own code.

Each rollout of ``parity_batch()`` goes through ``tracerl_slime.generate.generate``
(rows -> slime ``Sample``s, failures -> one removed ABORTED sample), the step's
samples through ``tracerl_slime.rewards.post_process_rewards``, and the result
through slime's own step from rewards to per-token advantages, re-stated in
``slime_token_advantages`` from THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515:
``RolloutManager._convert_samples_to_train_data`` (``slime/ray/rollout.py``: a
``remove_sample`` sample's loss mask is zeroed) and ``get_grpo_returns``
(``slime/utils/ppo_utils.py``: every response token of a sample gets its
reward, for grpo/gspo/cispo). The per-token advantages must equal
``expected_token_advantages``.

Stand-ins: the rollout runner replays the fixture's outcomes (they are what
``RolloutRunner.run_one`` returns; running real agents is covered by
``test_generate_scripted.py``) and ``Sample`` is the plugin's stand-in (slime
is not installable here). Intended difference, none: with a tracerl config on
``args`` the post-processor uses core's spread (``algorithm.std``, eps 1e-4).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import compose_tracerl, slime_args
from omegaconf import open_dict
from tracerl_slime.generate import generate
from tracerl_slime.host import WorkerHost
from tracerl_slime.rewards import post_process_rewards

from core.rollout import RolloutOutcome
from core.testing.parity import ParityRollout, expected_token_advantages, parity_batch
from core.types import SamplingParams

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64}


class ReplayRunner:
    """Returns the fixture's outcome for the rollout named in the payload."""

    def __init__(self, batch: list[ParityRollout]) -> None:
        self.by_id = {r.request.rollout_id: r for r in batch}

    async def run_one(
        self, payload: dict[str, Any], *, group_id: str, sampling: SamplingParams
    ) -> RolloutOutcome:
        r = self.by_id[payload["parity"]]
        assert group_id == f"slime-{payload['group_index']}"
        return RolloutOutcome(request=r.request, result=r.result, rows=[row for row in r.rows])


def slime_token_advantages(samples: list[Any], rewards: list[float]) -> dict[tuple[str, int], list[float]]:
    """Per-token advantage slime trains each sample with, aligned with ``sample.tokens``,
    keyed by (tracerl rollout id, row); samples with nothing to train are left out."""
    out: dict[tuple[str, int], list[float]] = {}
    for s, reward in zip(samples, rewards, strict=True):
        mask = [0] * s.response_length if s.remove_sample else list(s.loss_mask)
        assert len(mask) == s.response_length
        if not any(mask):
            continue
        returns = [reward] * s.response_length  # get_grpo_returns
        prompt = len(s.tokens) - s.response_length
        meta = s.metadata["tracerl"]
        key = (meta["tracerl_rollout_id"], meta["row"])
        assert key not in out, key
        out[key] = [0.0] * prompt + [a * m for a, m in zip(returns, mask, strict=True)]
    return out


def _run(batch: list[ParityRollout], args: Any, cfg: Any, tokenizer: Any) -> list[Any]:
    groups = {g: i for i, g in enumerate(dict.fromkeys(r.request.group_id for r in batch))}

    async def go() -> list[Any]:
        WorkerHost._instance = WorkerHost(cfg, tokenizer, None, None, None, ReplayRunner(batch))
        try:
            outs = []
            for index, r in enumerate(batch):  # slime's data source: group_index and index
                from tracerl_slime.sample import Sample

                g = groups[r.request.group_id]
                sample = Sample(
                    group_index=g,
                    index=index,
                    prompt="p",
                    metadata={"tracerl_payload": {"parity": r.request.rollout_id, "group_index": g}},
                )
                outs.append(await generate(args, sample, dict(SAMPLING)))
            return [s for out in outs for s in out]
        finally:
            WorkerHost._instance = None

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("std", "normalize_std"), [("population", True), ("sample", True), ("population", False)]
)
def test_slime_trains_the_parity_batch_as_specified(
    tiny_tokenizer: Any, std: str, normalize_std: bool
) -> None:
    batch = parity_batch()
    cfg = compose_tracerl(["backend=slime", "backend.dry_run=true"])
    with open_dict(cfg):
        cfg.algorithm.std = std
        cfg.algorithm.normalize_std = normalize_std
    args = slime_args(cfg, grpo_std_normalization=normalize_std)  # translate: --disable-grpo-std-normalization
    samples = _run(batch, args, cfg, tiny_tokenizer)

    # every failed rollout is one removed ABORTED sample, whatever its status
    removed = {s.metadata["tracerl"]["tracerl_rollout_id"]: s for s in samples if s.remove_sample}
    assert set(removed) == {"survivor-1", "survivor-2", "broken-2", "broken-3"}
    assert removed["broken-2"].metadata["tracerl"]["status"] == "sampler_error"
    assert removed["broken-3"].metadata["tracerl"]["status"] == "no_model_calls"
    assert all(s.status.value == "aborted" for s in removed.values())
    # the forked rollout is two samples sharing one rollout_id
    forked = [s for s in samples if s.metadata["tracerl"].get("tracerl_rollout_id") == "forked-0"]
    assert len(forked) == 2 and len({s.rollout_id for s in forked}) == 1

    _, rewards = post_process_rewards(args, samples)
    got = slime_token_advantages(samples, rewards)
    expected = expected_token_advantages(batch, std=std, normalize_std=normalize_std)  # type: ignore[arg-type]
    assert set(got) == set(expected)
    for key, tokens in expected.items():
        assert got[key] == pytest.approx(tokens, abs=1e-6), key


def test_without_a_tracerl_config_the_post_processor_keeps_slimes_arithmetic() -> None:
    """Used on its own (no tracerl config on args), the spread is slime's: Bessel + 1e-6."""
    from tracerl_slime.rewards import spread_of

    assert spread_of(SimpleNamespace(tracerl=None)) == ("sample", 1e-6)

"""Conformance suite every driven backend runs (in-tree and third-party alike).

Usage, in the backend's own tests::

    import pytest
    from core.testing.conformance import BackendConformance

    class TestMyBackendConformance(BackendConformance):
        logprob_atol = 1e-4          # None when the trainer cannot be compared (remote fakes)

        @pytest.fixture
        def backend(self):
            return make_backend_for_tests()

Each test runs its body in one ``asyncio.run`` and closes the backend at the
end. The suite checks behaviour, not implementation: the sampler contract,
datum shapes, loss names, rebind semantics and state round trips; ``MultiPolicyConformance``
adds the cases of a backend that declares ``multi_policy`` (instances that train, sync, save,
restore and close apart). ``BackendConformance`` fails a backend that declares
``multi_policy`` (its registered ``BackendSpec``, looked up by the backend's ``name``) when its
test module has no ``MultiPolicyConformance`` suite.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from core.errors import BackendNotFoundError, ConfigError
from core.interfaces import LOSS_NAMES, Sampler, TrainingBackend
from core.types import AdamParams, Datum, FinishReason, SampleResult, SamplingParams


def datum_from_sample(
    prompt: list[int], sample: SampleResult, advantage: float = 1.0
) -> Datum:
    """The datum core builds for a one-turn row: prompt + generated tokens."""
    tokens = list(prompt) + list(sample.token_ids)
    mask = [0] * len(prompt) + [1] * len(sample.token_ids)
    logprobs = [0.0] * len(prompt) + list(sample.logprobs)
    return Datum(
        model_input=tokens[:-1],
        target_tokens=tokens[1:],
        logprobs=logprobs[1:],
        advantages=[advantage * m for m in mask[1:]],
        weights=[float(m) for m in mask[1:]],
    )


class BackendConformance:
    """Mixin of tests; subclasses provide a ``backend`` fixture."""

    logprob_atol: float | None = 1e-3
    """Largest allowed |sampler logprob - trainer logprob|; None skips the comparison."""
    supports_state: bool = True
    """Whether ``save_state``/``load_state`` work in the test setup."""

    @pytest.fixture
    def backend(self) -> TrainingBackend:  # pragma: no cover - subclasses override
        raise NotImplementedError("subclass BackendConformance and define a `backend` fixture")

    @pytest.fixture
    def prompt_token_ids(self, backend: TrainingBackend) -> list[int]:
        """A short chat prompt rendered with the backend's own tokenizer."""
        tok = backend.get_tokenizer()
        text = tok.apply_chat_template(
            [{"role": "user", "content": "After 3?"}], tokenize=False, add_generation_prompt=True
        )
        return list(tok.encode(text, add_special_tokens=False))

    @staticmethod
    def run(backend: TrainingBackend, body: Callable[[], Awaitable[Any]]) -> Any:
        async def _main() -> Any:
            try:
                return await body()
            finally:
                await backend.aclose()

        return asyncio.run(_main())

    # -- sampler ------------------------------------------------------------

    def test_sampler_contract(self, backend: TrainingBackend, prompt_token_ids: list[int]) -> None:
        async def body() -> None:
            sampler = backend.sampler
            assert isinstance(sampler, Sampler)
            params = SamplingParams(max_tokens=6, temperature=1.0, seed=0)
            out = await sampler.sample(prompt_token_ids, params, session_id="conformance")
            assert isinstance(out, SampleResult)
            assert 1 <= len(out.token_ids) <= 6
            assert len(out.logprobs) == len(out.token_ids)
            assert all(math.isfinite(lp) and lp <= 1e-6 for lp in out.logprobs)
            assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            if out.finish_reason is FinishReason.LENGTH:
                assert len(out.token_ids) == 6
            assert out.weight_version == backend.weight_version

        self.run(backend, body)

    def test_max_tokens_one(self, backend: TrainingBackend, prompt_token_ids: list[int]) -> None:
        async def body() -> None:
            out = await backend.sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=1), session_id="c"
            )
            assert len(out.token_ids) == 1

        self.run(backend, body)

    def test_concurrent_requests(self, backend: TrainingBackend, prompt_token_ids: list[int]) -> None:
        async def body() -> None:
            params = SamplingParams(max_tokens=4)
            outs = await asyncio.gather(
                *(
                    backend.sampler.sample(prompt_token_ids, params, session_id=f"s{i}")
                    for i in range(8)
                )
            )
            assert len(outs) == 8
            assert all(1 <= len(o.token_ids) <= 4 for o in outs)

        self.run(backend, body)

    # -- training -------------------------------------------------------------

    def test_forward_backward_and_logprob_agreement(
        self, backend: TrainingBackend, prompt_token_ids: list[int]
    ) -> None:
        async def body() -> None:
            sample = await backend.sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=6), session_id="fb"
            )
            datum = datum_from_sample(prompt_token_ids, sample)
            result = await backend.forward_backward([datum], "importance_sampling")
            assert math.isfinite(result.metrics["loss"])
            if self.logprob_atol is not None:
                assert len(result.logprobs) == 1
                trainer = result.logprobs[0]
                assert len(trainer) == len(datum.target_tokens)
                gaps = [
                    abs(trainer[i] - datum.logprobs[i])
                    for i, w in enumerate(datum.weights)
                    if w > 0
                ]
                assert max(gaps) <= self.logprob_atol, f"largest logprob gap {max(gaps):.3g}"

        self.run(backend, body)

    def test_every_loss_name_is_accepted(
        self, backend: TrainingBackend, prompt_token_ids: list[int]
    ) -> None:
        async def body() -> None:
            sample = await backend.sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=4), session_id="loss"
            )
            datum = datum_from_sample(prompt_token_ids, sample)
            for loss in LOSS_NAMES:
                result = await backend.forward_backward([datum], loss)  # type: ignore[arg-type]
                assert math.isfinite(result.metrics["loss"]), loss

        self.run(backend, body)

    def test_unknown_loss_is_a_config_error(
        self, backend: TrainingBackend, prompt_token_ids: list[int]
    ) -> None:
        async def body() -> None:
            sample = await backend.sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=2), session_id="bad"
            )
            with pytest.raises(ConfigError, match="no_such_loss"):
                await backend.forward_backward(
                    [datum_from_sample(prompt_token_ids, sample)], "no_such_loss"  # type: ignore[arg-type]
                )

        self.run(backend, body)

    def test_sync_sampler_bumps_weight_version(
        self, backend: TrainingBackend, prompt_token_ids: list[int]
    ) -> None:
        async def body() -> None:
            before = backend.weight_version
            sample = await backend.sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=4), session_id="v"
            )
            await backend.forward_backward([datum_from_sample(prompt_token_ids, sample)], "ppo")
            metrics = await backend.optim_step(AdamParams(learning_rate=1e-3))
            assert isinstance(metrics, dict)
            sampler = await backend.sync_sampler()
            assert backend.weight_version == before + 1
            after = await sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=2), session_id="v"
            )
            assert after.weight_version == before + 1

        self.run(backend, body)

    def test_state_round_trip(self, backend: TrainingBackend, prompt_token_ids: list[int]) -> None:
        if not self.supports_state:
            pytest.skip("backend declares no state round trip in tests")

        async def body() -> None:
            sample = await backend.sampler.sample(
                prompt_token_ids, SamplingParams(max_tokens=4), session_id="st"
            )
            datum = datum_from_sample(prompt_token_ids, sample)
            with tempfile.TemporaryDirectory() as tmp:
                where = await backend.save_state(f"{tmp}/state")
                first = await backend.forward_backward([datum], "cross_entropy")
                await backend.optim_step(AdamParams(learning_rate=1e-2))
                await backend.sync_sampler()
                await backend.load_state(where)
                again = await backend.forward_backward([datum], "cross_entropy")
            assert again.metrics["loss"] == pytest.approx(first.metrics["loss"], abs=1e-5)
            if first.logprobs and again.logprobs:
                gaps = [abs(a - b) for a, b in zip(first.logprobs[0], again.logprobs[0], strict=True)]
                assert max(gaps) <= 1e-5

        self.run(backend, body)

    def test_a_multi_policy_backend_runs_the_multi_policy_cases(
        self, backend: TrainingBackend, request: pytest.FixtureRequest
    ) -> None:
        """A backend whose ``BackendSpec`` declares ``multi_policy`` has a ``MultiPolicyConformance``
        suite in the same test module (core's loop builds one instance per policy)."""
        from core.plugins import load_plugins

        name = str(getattr(backend, "name", ""))
        asyncio.run(backend.aclose())
        try:
            declared = bool(load_plugins().backend(name).multi_policy)
        except BackendNotFoundError:
            declared = False  # not registered here (a backend built directly): nothing declared
        suites = [
            v for v in vars(request.module).values()
            if isinstance(v, type) and issubclass(v, MultiPolicyConformance) and v is not MultiPolicyConformance
        ]
        assert not declared or suites, (
            f"backend {name!r} declares multi_policy: add a MultiPolicyConformance subclass with a `backends` "
            "fixture (two instances built as for two policies) to this test module"
        )


class MultiPolicyConformance:
    """Mixin of tests for a backend that declares ``multi_policy``: core's loop builds one
    instance per policy from the same config (docs/multi_agent.md), so two instances must
    train, serve and version apart. Subclasses provide a ``backends`` fixture: two instances
    built as the backend's factory builds them for two policies of one run.
    """

    compares_samples: bool = True
    """Whether what a sampler serves shows its weights: False for a stand-in at a network edge
    whose sampler is no model (seeded noise per call), which leaves out the comparisons of
    sampled tokens and logprobs; versions, trainer outputs and checkpoints are still checked."""

    @pytest.fixture
    def backends(self) -> tuple[TrainingBackend, TrainingBackend]:  # pragma: no cover - subclasses override
        raise NotImplementedError("subclass MultiPolicyConformance and define a `backends` fixture")

    def test_policies_train_and_serve_apart(self, backends: tuple[TrainingBackend, TrainingBackend]) -> None:
        first, second = backends
        tok = first.get_tokenizer()
        text = tok.apply_chat_template(
            [{"role": "user", "content": "After 3?"}], tokenize=False, add_generation_prompt=True
        )
        prompt = list(tok.encode(text, add_special_tokens=False))
        params = SamplingParams(max_tokens=4, seed=7)

        async def body() -> None:
            try:
                before = await second.sampler.sample(prompt, params, session_id="p2")
                sample = await first.sampler.sample(prompt, params, session_id="p1")
                for _ in range(3):
                    await first.forward_backward([datum_from_sample(prompt, sample)], "cross_entropy")
                    await first.optim_step(AdamParams(learning_rate=1e-2))
                await first.sync_sampler()
                assert (first.weight_version, second.weight_version) == (1, 0)
                trained = await first.sampler.sample(prompt, params, session_id="p1")
                untouched = await second.sampler.sample(prompt, params, session_id="p2")
                assert trained.weight_version == 1 and untouched.weight_version == 0
                if self.compares_samples:
                    # The trained policy moved towards its sample; the other serves what it did.
                    assert sum(trained.logprobs) > sum(sample.logprobs)
                    assert untouched.token_ids == before.token_ids
                    assert untouched.logprobs == pytest.approx(before.logprobs, abs=1e-6)
            finally:
                await first.aclose()
                await second.aclose()

        asyncio.run(body())

    def test_policies_train_apart_and_close_apart(self, backends: tuple[TrainingBackend, TrainingBackend]) -> None:
        """Training and syncing one policy moves its own trainer output and version only: the
        other's trainer computes what it did (separate weights in the trainer, not only in the
        sampler), and closing the first leaves the second working."""
        first, second = backends
        prompt = _prompt(first)

        async def body() -> None:
            try:
                assert first.sampler is not second.sampler
                sample = await first.sampler.sample(prompt, SamplingParams(max_tokens=4), session_id="p1")
                datum = datum_from_sample(prompt, sample)
                mine = await first.forward_backward([datum], "cross_entropy")
                theirs = await second.forward_backward([datum], "cross_entropy")
                version = second.weight_version
                await first.optim_step(AdamParams(learning_rate=1e-2))
                await first.sync_sampler()
                moved = await first.forward_backward([datum], "cross_entropy")
                kept = await second.forward_backward([datum], "cross_entropy")
                assert moved.metrics["loss"] != pytest.approx(mine.metrics["loss"], abs=1e-6), "the trained policy did not move"
                assert kept.metrics["loss"] == pytest.approx(theirs.metrics["loss"], abs=1e-5), "training one policy moved the other"
                assert second.weight_version == version
                await first.aclose()
                after = await second.sampler.sample(prompt, SamplingParams(max_tokens=2), session_id="p2")
                assert 1 <= len(after.token_ids) <= 2 and after.weight_version == version
            finally:
                await first.aclose()
                await second.aclose()

        asyncio.run(body())

    def test_policies_save_and_restore_apart(self, backends: tuple[TrainingBackend, TrainingBackend]) -> None:
        """Each policy saves where the loop saves it (``step_N/backend/<policy>``) and restores its
        own weights, not the other's."""
        first, second = backends
        prompt = _prompt(first)

        async def body() -> None:
            try:
                sample = await first.sampler.sample(prompt, SamplingParams(max_tokens=4), session_id="s1")
                datum = datum_from_sample(prompt, sample)
                await first.forward_backward([datum], "cross_entropy")
                await first.optim_step(AdamParams(learning_rate=1e-2))
                await first.sync_sampler()  # the first policy is one step ahead of the second
                with tempfile.TemporaryDirectory() as tmp:
                    where = [
                        await b.save_state(f"{tmp}/step_000001/backend/{name}")
                        for b, name in ((first, "first"), (second, "second"))
                    ]
                    assert where[0] != where[1]
                    saved = [(await b.forward_backward([datum], "cross_entropy")).metrics["loss"] for b in (first, second)]
                    assert saved[0] != pytest.approx(saved[1], abs=1e-6)
                    for b in (first, second):
                        await b.optim_step(AdamParams(learning_rate=1e-2))
                        await b.sync_sampler()
                    await first.load_state(where[0])
                    await second.load_state(where[1])
                    again = [(await b.forward_backward([datum], "cross_entropy")).metrics["loss"] for b in (first, second)]
                assert again == pytest.approx(saved, abs=1e-5)
            finally:
                await first.aclose()
                await second.aclose()

        asyncio.run(body())


def _prompt(backend: TrainingBackend) -> list[int]:
    """A short chat prompt rendered with ``backend``'s tokenizer."""
    tok = backend.get_tokenizer()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "After 3?"}], tokenize=False, add_generation_prompt=True
    )
    return list(tok.encode(text, add_special_tokens=False))

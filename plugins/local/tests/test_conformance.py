"""The local backend passes core's backend conformance suite."""

from __future__ import annotations

import pytest
from tracerl_local.backend import LocalBackend
from tracerl_local.config import LocalBackendConfig

from core.testing.conformance import BackendConformance, MultiPolicyConformance


class TestLocalBackendConformance(BackendConformance):
    logprob_atol = 1e-4

    @pytest.fixture
    def backend(self) -> LocalBackend:
        return LocalBackend(LocalBackendConfig(), seed=0)


class TestLocalMultiPolicyConformance(MultiPolicyConformance):
    """``backend=local`` declares ``multi_policy``: a backend per policy, from one config and seed."""

    @pytest.fixture
    def backends(self) -> tuple[LocalBackend, LocalBackend]:
        return LocalBackend(LocalBackendConfig(), seed=0), LocalBackend(LocalBackendConfig(), seed=0)

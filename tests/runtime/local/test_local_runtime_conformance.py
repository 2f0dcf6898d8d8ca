"""The local runtime passes the runtime conformance suite (``core.testing.RuntimeConformance``)."""

from __future__ import annotations

from typing import Any

import pytest

from core.runtime import LocalRuntime
from core.testing import CONFORMANCE_AGENT, RuntimeConformance, build_runtime


@pytest.mark.integration
class TestLocalRuntimeConformance(RuntimeConformance):
    @pytest.fixture
    def runtime(self) -> Any:
        # built the way a run builds it: the registered factory over the composed config
        rt = build_runtime("local", [f"task.agent={CONFORMANCE_AGENT}", "runtime.num_processes=1"])
        assert isinstance(rt, LocalRuntime) and rt.config.num_processes == 1
        return rt

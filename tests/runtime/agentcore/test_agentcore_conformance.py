"""The AgentCore runtime passes the runtime conformance suite (``core.testing.RuntimeConformance``).

AWS cannot be reached from CI: the data plane is tracerl's stand-in
(``core.testing.agentcore_standin``) running one real agent process per session, so
``die`` kills a session's process as it would kill a microVM's agent; boto3 is
the real client, pointed at the stand-in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acr_helpers import agent_env, make_runtime

from core.testing import CONFORMANCE_AGENT, RuntimeConformance
from core.testing.agentcore_standin import AcrStandIn, StandInServer


@pytest.mark.integration
class TestAgentCoreRuntimeConformance(RuntimeConformance):
    @pytest.fixture
    def runtime(self, tmp_path: Path) -> Iterator[Any]:
        standin = AcrStandIn(agent=CONFORMANCE_AGENT, env=agent_env(), workdir=tmp_path)
        with StandInServer(standin) as server:
            yield make_runtime(server.url)

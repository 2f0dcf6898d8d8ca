"""Integration tier: verl's own LLMServerManager and AgentLoopManagerTQ run our loop on real Ray.

No fakes: ``integration_driver.py`` (its own process, since Ray owns the
process) composes verl's real config, starts Ray and TransferQueue, serves
the tiny model through the ``tracerl_cpu`` replica (tracerl-local's sampler),
loads ``TracerlAgentLoop`` from the agent-loop YAML the launcher writes, and
submits three prompts (rollout.n=2) as verl's v1 trainer does. The agents run
under the local runtime and call the gateway with the openai SDK.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from verl_fixtures import AGENTS_DIR

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("integration_driver.py")


def _segments(mask: list[int]) -> list[tuple[int, int]]:
    """(value, run length) of each run in ``mask``."""
    runs: list[tuple[int, int]] = []
    for m in mask:
        if runs and runs[-1][0] == m:
            runs[-1] = (m, runs[-1][1] + 1)
        else:
            runs.append((m, 1))
    return runs


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("verl_integration")
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(run_dir), str(AGENTS_DIR)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    log = proc.stdout + proc.stderr
    (run_dir / "driver.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.integration
def test_groups_finish_and_a_crash_fails_only_its_group(result: dict[str, Any]) -> None:
    assert result["status"] == {"two_turn": "finished", "fork": "finished", "crash": "failure"}
    assert result["rows"]["crash"] == []
    # every turn went through verl's client to the replica: 2x2 + 2x3 + 2x1 calls
    assert result["server"]["calls"] == 12


@pytest.mark.slow
@pytest.mark.integration
def test_multi_turn_rows_mask_tool_output_and_carry_logprobs(result: dict[str, Any]) -> None:
    rows = result["rows"]["two_turn"]
    assert sorted(r["key"] for r in rows) == ["0_0", "1_0"]  # one row per session (rollout.n=2)
    for row in rows:
        runs = _segments(row["mask"])
        # generated turn, tool/user tokens, generated turn (maybe padding after)
        assert [v for v, _ in runs][:3] == [1, 0, 1], runs
        assert all(n <= 5 for v, n in runs if v == 1)  # algorithm.max_tokens=5 per turn
        trained = [lp for lp, m in zip(row["logprobs"], row["mask"], strict=True) if m]
        untrained = [lp for lp, m in zip(row["logprobs"], row["mask"], strict=True) if not m]
        assert all(lp < 0 for lp in trained) and all(lp == 0 for lp in untrained)
        assert 0.0 <= row["reward"] <= 1.0
        assert row["tags"] == {"status": "success", "min_global_steps": 0, "max_global_steps": 0}


@pytest.mark.slow
@pytest.mark.integration
def test_forked_rollout_yields_two_rows_most_trained_last(result: dict[str, Any]) -> None:
    rows = result["rows"]["fork"]
    assert sorted(r["key"] for r in rows) == ["0_0", "0_1", "1_0", "1_1"]
    for session in ("0", "1"):
        first, last = (next(r for r in rows if r["key"] == f"{session}_{i}") for i in (0, 1))
        assert sum(first["mask"]) < sum(last["mask"])
        assert first["reward"] == pytest.approx(last["reward"])
        # the fork is a fresh one-turn conversation: its response is all generated
        assert set(first["mask"]) == {1}

"""``python -m pytest`` (the main suite) does not import ray, though ``tests/runtime/ray/cluster`` is
among its test paths (marker ``ray``: this check costs a pytest collection, ~3 s of CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[4]

COLLECT = (
    "import sys, pytest\n"
    "code = pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *sys.argv[1:]])\n"
    "print('ray imported:', 'ray' in sys.modules, 'exit:', int(code))\n"
)


def _collect(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", COLLECT, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    return proc.stdout + proc.stderr


def test_the_main_suite_collects_the_ray_folder_without_importing_ray() -> None:
    out = _collect("tests/runtime/ray")
    assert "ray imported: False exit: 0" in out, out
    assert "test_ray_dispatch.py::" in out and "tests/runtime/ray/cluster/" not in out, out


def test_marker_ray_collects_the_cluster_tests() -> None:
    out = _collect("-m", "ray", "tests/runtime/ray/cluster")
    assert "ray imported: True exit: 0" in out, out
    for module in (
        "test_ray_runtime.py", "test_ray_node_loss.py", "test_ray_private.py", "test_ray_collection.py",
        "test_ray_node_shards.py",
    ):
        assert f"tests/runtime/ray/cluster/{module}::" in out, (module, out)

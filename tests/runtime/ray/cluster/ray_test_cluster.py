"""Helpers of the ``ray`` runtime's tests: a real multi-node Ray cluster on loopback.

``ray.cluster_utils.Cluster`` starts a head and worker raylets on this machine
(each its own node: own raylet, object store and worker processes; all report
this machine's IP). One cluster serves a whole test module; teardown checks
that none of its processes outlived it.
"""

from __future__ import annotations

import os
import time
from typing import Any

# Ray is the point of these tests: a missing `ray` is an error (scripts/setup.sh test installs it).
import ray
from ray.cluster_utils import Cluster

# Small, quiet nodes: this machine has 2 cores shared with other work.
NODE_ARGS: dict[str, Any] = {
    "num_cpus": 1,
    "object_store_memory": 80 * 2**20,
    "include_dashboard": False,
}
# Fast node-death detection (Ray's defaults take ~30 s to declare a node dead).
SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


def _pids(cluster: Cluster) -> list[int]:
    pids = []
    for node in cluster.list_all_nodes():
        for infos in node.all_processes.values():
            pids.extend(info.process.pid for info in infos if info.process is not None)
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def start_cluster(workers: int, labels: dict[str, str] | None = None) -> Cluster:
    """A head plus ``workers`` worker nodes (each with node ``labels``), with this process
    connected as the driver."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODE_ARGS, "_system_config": SYSTEM_CONFIG},
    )
    for _ in range(workers):
        cluster.add_node(**NODE_ARGS, labels=dict(labels or {}))
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    """Disconnect, stop every node, and fail if one of its processes is still running."""
    pids = _pids(cluster)
    ray.shutdown()
    cluster.shutdown()
    deadline = time.monotonic() + 15
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes outlived the test cluster: {left}"


def agent_actor_states(prefix: str) -> dict[str, str]:
    """Name -> state of every actor whose name starts with ``prefix`` (from Ray's GCS)."""
    from ray._private import state

    return {
        str(a["Name"]): str(a["State"])
        for a in state.actors().values()
        if str(a.get("Name") or "").startswith(prefix)
    }


def agent_actors(prefix: str) -> list[dict[str, Any]]:
    """GCS records (``Name``, ``State``, ``Address.NodeID``...) of actors named ``prefix*``."""
    from ray._private import state

    return [a for a in state.actors().values() if str(a.get("Name") or "").startswith(prefix)]

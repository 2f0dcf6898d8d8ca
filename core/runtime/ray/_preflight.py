"""Start-up checks of the ``ray`` runtime: ``check_ray_version``, ``check_private_ray_auth``
and ``check_gateway_reachable``.

Agents on other machines cannot dial the trainer's loopback. Which nodes are
"other machines" is decided by IP, not by node count: every Ray node reports
the IP its raylet listens on (``NodeManagerAddress``), and nodes started on
this machine (``ray.cluster_utils.Cluster`` test clusters, a second raylet on
the same host) report the driver's own IP. A loopback gateway is allowed
exactly when every alive node shares that IP.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from core.errors import ConfigError
from core.runtime.agentcore._preflight import is_local_host

MIN_RAY = (2, 60)
"""Oldest Ray the runtime accepts: the one the project tests (``pyproject.toml``'s ``ray`` extra).
Ray 2.40 let a second driver with no token join a cluster and run commands."""

RAY_INSTALL_HINT = "pip install 'tracerl[ray]' (or pip install 'ray>=2.60')"


def check_ray_version(version: str) -> None:
    """Refuse a Ray older than ``MIN_RAY``.

    Raises:
        ConfigError: ``version`` is older, or not a version at all.
    """
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) < MIN_RAY:
        raise ConfigError(
            f"runtime=ray needs Ray >= {MIN_RAY[0]}.{MIN_RAY[1]} (token authentication, the "
            f"version the runtime is tested with); found {version!r}. {RAY_INSTALL_HINT} on the "
            "trainer and on every node of the cluster"
        )


def check_private_ray_auth(environ: Mapping[str, str]) -> None:
    """Refuse to start a private Ray with its token authentication turned off.

    The private Ray's GCS and raylet listen on every interface (Ray resolves a
    loopback node address to the machine's routable one); its token is what keeps
    other hosts from joining it as drivers and running commands.

    Raises:
        ConfigError: ``RAY_AUTH_MODE=disabled``.
    """
    mode = environ.get("RAY_AUTH_MODE", "").strip().lower()
    if mode == "disabled":
        raise ConfigError(
            "runtime=ray would start a private Ray with RAY_AUTH_MODE=disabled: its ports listen "
            "on every interface of this machine and anyone who reaches them could join as a "
            "driver and run commands. Unset RAY_AUTH_MODE (token authentication is Ray's "
            "default), or set runtime.address to a cluster you secured yourself"
        )


def remote_node_ips(node_ips: Iterable[str], driver_ip: str) -> list[str]:
    """The node IPs that are not this machine's (sorted, without repeats)."""
    local = {driver_ip, "127.0.0.1", "::1", "localhost"}
    return sorted({ip for ip in node_ips if ip and ip not in local})


def check_gateway_reachable(gateway_host: str, *, node_ips: Iterable[str], driver_ip: str) -> None:
    """Refuse a loopback gateway address when agent actors may run on another machine.

    Args:
        gateway_host: The host agents will be told to dial (``gateway.public_host`` or ``gateway.host``).
        node_ips: The IPs of the cluster's alive nodes.
        driver_ip: This machine's IP as Ray sees it (``ray.util.get_node_ip_address()``).

    Raises:
        ConfigError: ``gateway_host`` is loopback or unspecified and a node is elsewhere.
    """
    if not gateway_host or not is_local_host(gateway_host):
        return
    remote = remote_node_ips(node_ips, driver_ip)
    if not remote:
        return
    shown = ", ".join(remote[:5]) + (f" and {len(remote) - 5} more" if len(remote) > 5 else "")
    raise ConfigError(
        f"the gateway is advertised at {gateway_host!r} (gateway.public_host/host), but the Ray "
        f"cluster has nodes on other machines ({shown}; this machine is {driver_ip}): their "
        "agents would dial their own loopback, every rollout would fail to reach the model and "
        "the run would train on nothing. Set gateway.public_host to an address the worker "
        "nodes reach (this machine's IP or a service name, e.g. gateway.public_host="
        f"{driver_ip}) and bind the gateway beyond loopback (gateway.host=0.0.0.0). "
        "See docs/runtime.md#the-ray-runtime."
    )

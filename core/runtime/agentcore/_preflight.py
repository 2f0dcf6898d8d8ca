"""Checks the ``agentcore`` runtime makes before it sends a single rollout.

Defines ``is_local_host``, ``runtime_is_remote``, ``check_gateway_reachable``
and ``public_base_url``. The check that matters: an agent in an AgentCore
microVM cannot dial the trainer's loopback address. Other toolkits let that
through; every rollout then failed to reach the model, scored 0.0, and the
run "trained" for hours on nothing. We refuse to start instead.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from core.errors import ConfigError


def is_local_host(host: str) -> bool:
    """True for loopback (127.0.0.0/8, ::1, localhost) and unspecified (0.0.0.0, ::) addresses.

    An unspecified address is what a server *binds* to listen everywhere; no
    client can dial it, so advertising it is the same mistake.
    """
    h = host.strip().strip("[]").lower()
    if not h or h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def runtime_is_remote(endpoint_url: str) -> bool:
    """True unless the data plane is a loopback endpoint (the local stand-in)."""
    if not endpoint_url:
        return True
    return not is_local_host(urlsplit(endpoint_url).hostname or "")


def public_base_url(base_url: str, *, host: str = "", port: int = 0, scheme: str = "") -> str:
    """``base_url`` with its scheme, host and port replaced where given (path kept)."""
    if not (host or port or scheme):
        return base_url
    parts = urlsplit(base_url)
    new_host = host or parts.hostname or ""
    if ":" in new_host and not new_host.startswith("["):
        new_host = f"[{new_host}]"
    new_port = port or parts.port
    netloc = f"{new_host}:{new_port}" if new_port else new_host
    return urlunsplit((scheme or parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_gateway_reachable(gateway_host: str, *, endpoint_url: str, where: str) -> None:
    """Refuse a loopback gateway address when agents run on AgentCore.

    Args:
        gateway_host: The host agents will be told to dial.
        endpoint_url: The runtime's data-plane endpoint ("" is AWS).
        where: The config key (or URL) the host came from, for the message.

    Raises:
        ConfigError: the runtime is remote and ``gateway_host`` is loopback or unspecified.
    """
    if not runtime_is_remote(endpoint_url) or not is_local_host(gateway_host):
        return
    raise ConfigError(
        f"the gateway is advertised at {gateway_host!r} ({where}), which an agent in an "
        "AgentCore microVM cannot reach: it would dial its own loopback, every rollout would "
        "fail to reach the model and the run would train on nothing. Set "
        "runtime.gateway_public_host (and runtime.gateway_public_port) to an address the "
        "runtime's VPC can reach (a private IP, or a load balancer in front of the gateway), "
        "bind the gateway beyond loopback (gateway.host=0.0.0.0) and open its port to the "
        "runtime's security group. See docs/agentcore.md#networking."
    )

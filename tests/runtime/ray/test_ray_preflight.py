"""The ``ray`` runtime's checks that need no cluster (main suite): the loopback-gateway
preflight by node IP, and the config node as ``runtime=ray`` composes it."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from core.errors import ConfigError
from core.runtime.ray import RayRuntime, check_gateway_reachable
from core.testing import CONFORMANCE_AGENT, build_runtime


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0.0.0.0", "::1"])
def test_a_loopback_gateway_is_refused_when_a_node_has_another_ip(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_gateway_reachable(host, node_ips=["10.0.0.5", "10.0.0.6", "10.0.0.5"], driver_ip="10.0.0.5")
    text = str(info.value)
    assert repr(host) in text and "10.0.0.6" in text and "gateway.public_host=10.0.0.5" in text
    assert "10.0.0.5," not in text  # this machine's own nodes are not listed as remote


def test_a_loopback_gateway_is_accepted_when_every_node_is_this_machine() -> None:
    """``ray.cluster_utils.Cluster`` nodes (and any raylet started here) report the driver's IP."""
    check_gateway_reachable("127.0.0.1", node_ips=["192.0.2.2"] * 3, driver_ip="192.0.2.2")
    check_gateway_reachable("127.0.0.1", node_ips=["127.0.0.1", "127.0.0.1"], driver_ip="127.0.0.1")


def test_a_routable_gateway_is_accepted_with_remote_nodes() -> None:
    check_gateway_reachable("10.0.0.5", node_ips=["10.0.0.6", "10.0.0.7"], driver_ip="10.0.0.5")
    check_gateway_reachable("gateway.svc.cluster.local", node_ips=["10.0.0.6"], driver_ip="10.0.0.5")


def test_runtime_ray_composes_from_the_command_line() -> None:
    rt = build_runtime(
        "ray",
        [
            f"task.agent={CONFORMANCE_AGENT}",
            "runtime.address=auto",
            "runtime.agents_per_actor=8",
            "runtime.num_cpus_per_agent=0.25",
            "+runtime.resources_per_agent={sandbox: 0.5}",
            '+runtime.label_selector={ray.io/node-group: agents, zone: "in(a,b)"}',
            "+runtime.runtime_env={working_dir: .}",
            "gateway.public_host=10.1.2.3",
        ],
    )
    assert isinstance(rt, RayRuntime)
    options = rt._actor_options(0)
    assert options["num_cpus"] == 2.0 and options["resources"] == {"sandbox": 4.0}
    assert options["label_selector"] == {"ray.io/node-group": "agents", "zone": "in(a,b)"}
    assert options["runtime_env"] == {"working_dir": "."}
    assert options["scheduling_strategy"] == "SPREAD" and options["max_task_retries"] == 0
    assert rt.gateway_host == "10.1.2.3" and rt.config.address == "auto"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"num_actors": 0}, "num_actors"),
        ({"num_cpus_per_agent": -1}, "num_cpus_per_agent"),
        ({"resources_per_agent": {"sandbox": "lots"}}, "resources_per_agent.sandbox"),
        ({"scheduling_strategy": "PACK"}, "scheduling_strategy"),
        ({"result_channel": "s3"}, "s3_bucket"),
    ],
)
def test_bad_settings_are_refused_by_name(setting: dict[str, object], message: str) -> None:
    """Checked when the runtime is built (cheap: no Hydra composition, no ray)."""
    with pytest.raises(ConfigError, match=message):
        RayRuntime(CONFORMANCE_AGENT, **setting)


def test_each_actor_pool_gets_the_agent_server_settings() -> None:
    """``RayRuntimeConfig`` shares ``runtime=local``'s agent server settings by inheriting
    ``AgentServerSettings`` (one definition, docs included), and every one of them, with the
    actor's startup timeout and places, reaches the ``LocalRuntimeConfig`` each actor runs."""
    import dataclasses

    from core.runtime.config import AgentServerSettings, LocalRuntimeConfig
    from core.runtime.ray import RayRuntimeConfig

    shared = [f.name for f in dataclasses.fields(AgentServerSettings)]
    assert {"python", "max_restarts", "result_channel", "s3_bucket"} <= set(shared)
    assert issubclass(RayRuntimeConfig, AgentServerSettings) and issubclass(LocalRuntimeConfig, AgentServerSettings)
    values = {
        "python": "/opt/py/bin/python",
        "max_restarts": 3,
        "result_channel": "s3",
        "poll_interval_s": 0.2,
        "s3_bucket": "b",
        "s3_endpoint_url": "http://s3.local",
        "s3_exp_id": "exp",
        "pass_env": ["MY_TOOL_*"],
    }
    assert set(values) == set(shared), "give the new shared setting a non-default value here"
    rt = RayRuntime(CONFORMANCE_AGENT, agents_per_actor=5, processes_per_actor=3, startup_timeout_s=7.0, **values)
    local = rt._local_config()
    assert {k: getattr(local, k) for k in shared} == values
    assert (local.num_processes, local.max_concurrency, local.startup_timeout_s) == (3, 5, 7.0)
    # the actors' Ray env_vars reach their agents too (agents get an allowlisted environment)
    rt = RayRuntime(CONFORMANCE_AGENT, runtime_env={"env_vars": {"TOOL_KEY": "1"}}, **values)
    assert rt._local_config().pass_env == ["MY_TOOL_*", "TOOL_KEY"]


class _FakeRay:
    """Stands in for the ``ray`` module: records what ``ray.init`` was given."""

    def __init__(self, version: str) -> None:
        self.__version__ = version
        self.init_kwargs: dict[str, Any] | None = None

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.init_kwargs = kwargs


def test_ray_older_than_the_tested_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """#29: Ray 2.40 (the version the old install hint named) let a driver with no token join."""
    from core.runtime.ray._preflight import check_ray_version

    for old in ("2.40.0", "2.9.3", "1.13.0", "nightly"):
        with pytest.raises(ConfigError, match=r"Ray >= 2\.60.*ray>=2\.60"):
            check_ray_version(old)
    for fine in ("2.60.0", "2.61.1", "3.0.0.dev0"):
        check_ray_version(fine)
    monkeypatch.setitem(sys.modules, "ray", _FakeRay("2.40.0"))
    with pytest.raises(ConfigError, match="found '2.40.0'"):
        RayRuntime(CONFORMANCE_AGENT)._connect()


def test_the_private_ray_keeps_its_dashboard_on_loopback_and_its_token_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeRay("2.60.0")
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    RayRuntime(CONFORMANCE_AGENT)._connect()
    assert fake.init_kwargs is not None
    assert fake.init_kwargs["include_dashboard"] is False
    assert fake.init_kwargs["dashboard_host"] == "127.0.0.1"
    fake.init_kwargs = None
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ConfigError, match="RAY_AUTH_MODE=disabled"):
        RayRuntime(CONFORMANCE_AGENT)._connect()
    assert fake.init_kwargs is None, "nothing started"
    # a cluster the operator gives is theirs to secure: joined as given
    RayRuntime(CONFORMANCE_AGENT, address="ray://head:10001")._connect()
    assert fake.init_kwargs is not None and fake.init_kwargs["address"] == "ray://head:10001"

"""``policies`` in the run config: typed, checked, routed, and refused at start-up by every
backend that does not declare ``multi_policy`` (all but local and Tinker), and by an inference-server
fleet (it serves one set of weights); ``trainer.mode=async`` trains several."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.plugins import BackendRegistry, BackendSpec
from core.plugins.manager import load_plugins
from core.testing.build import compose_config
from core.trainer.config import PolicyConfig, load_train_config, policy_routes
from core.trainer.guards import check_policy_support
from core.trainer.policies import check_policy_modes
from core.types import DEFAULT_POLICY

ROOT = Path(__file__).resolve().parents[2]
TWO = ["+policies.planner={models:[gpt-planner]}", "+policies.coder={}"]


def test_no_policies_is_one_default_policy_and_needs_no_config() -> None:
    cfg = load_train_config(compose_config([]))
    assert cfg.policies == {}
    routes = policy_routes(cfg.policies)
    assert routes.names == (DEFAULT_POLICY,) and dict(routes.models) == {}


def test_policies_compose_from_the_command_line_into_typed_entries() -> None:
    cfg = load_train_config(compose_config(TWO))
    assert cfg.policies == {"planner": PolicyConfig(models=["gpt-planner"]), "coder": PolicyConfig()}
    routes = policy_routes(cfg.policies)
    assert routes.names == ("planner", "coder") and routes.default == "planner"
    assert dict(routes.models) == {"gpt-planner": "planner"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+policies.planner={models:[m]}", "+policies.coder={models:[m]}"], "'m' is routed to both policies"),
        (["+policies.planner={models:[coder]}", "+policies.coder={}"], "'coder' is routed to both policies"),
        (["+policies.planner={models:['']}"], "policies.planner.models must be non-empty model names"),
        (["+policies.planner={temprature:0.5}"], r"policies\.planner\.temprature: unknown setting"),
    ],
)
def test_bad_policies_are_refused_before_anything_starts(overrides: list[str], message: str) -> None:
    with pytest.raises(Exception, match=message):
        load_train_config(compose_config(overrides))


def test_a_policy_name_must_be_plain() -> None:
    """It names metric keys and checkpoint folders in the later slices."""
    for name in ("plan/ner", "", "-x", "a" * 65):
        with pytest.raises(ConfigError, match="a policy name is 1-64 letters"):
            policy_routes({name: PolicyConfig()})


def _spec(module: str, name: str) -> BackendSpec:
    registry = BackendRegistry()
    importlib.import_module(module).tracerl_register_backends(registry)
    spec = registry.get(name)
    assert spec is not None
    return spec


def _verl_spec() -> BackendSpec:
    """verl's real registration: its plugin module imports no verl (it must stay cheap), so it is
    loaded here from the source tree; verl itself lives in its own venv."""
    sys.path.insert(0, str(ROOT / "plugins" / "verl"))
    try:
        return _spec("tracerl_verl.plugin", "verl")
    finally:
        sys.path.remove(str(ROOT / "plugins" / "verl"))


def test_only_local_and_tinker_declare_multi_policy_and_every_other_backend_refuses_two() -> None:
    plugins = load_plugins()
    for name in ("local", "tinker"):
        assert plugins.backend(name).multi_policy is True, name
        check_policy_support(["planner", "coder"], plugins.backend(name))
    specs = [plugins.backend(name) for name in ("sagemaker", "slime")] + [_verl_spec()]
    for spec in specs:
        assert spec.multi_policy is False, spec.name
        check_policy_support(["solo"], spec)  # one policy is today's run
        check_policy_support([], spec)
        with pytest.raises(ConfigError) as err:
            check_policy_support(["planner", "coder"], spec)
        text = str(err.value)
        assert f"backend {spec.name!r} trains one policy per run" in text
        assert "['planner', 'coder']" in text and "multi_policy" in text and "docs/multi_agent.md" in text


@pytest.mark.parametrize("sampler", ["sglang", "vllm"])
def test_several_policies_are_refused_where_one_set_of_weights_is_served(sampler: str) -> None:
    check_policy_modes(["solo"], sampler=sampler)
    with pytest.raises(ConfigError, match=f"sampler={sampler!r} serves one set of weights; use sampler=backend"):
        check_policy_modes(["planner", "coder"], sampler=sampler)
    check_policy_modes(["planner", "coder"], sampler="backend")  # async or sync alike


def test_a_backend_that_declares_multi_policy_passes() -> None:
    spec = BackendSpec(name="multi", kind="driven", factory=lambda cfg: None, config={}, multi_policy=True)
    check_policy_support(["planner", "coder"], spec)


def test_core_train_refuses_two_policies_with_a_fleet_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from core.train import main

    run_dir = tmp_path / "run"
    fleet = ["sampler=sglang", "sampler.urls=[http://127.0.0.1:9]", "trainer.mode=async"]
    assert main(["backend=local", f"run_dir={run_dir}", *fleet, *TWO]) != 0
    err = capsys.readouterr().err
    assert "sampler='sglang' serves one set of weights" in err and "['planner', 'coder']" in err
    assert not (run_dir / "metrics.jsonl").exists()

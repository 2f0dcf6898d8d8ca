"""Importing core stays light: agent containers and CPU-only hosts must not pay
for torch, transformers or cloud SDKs they never use. Checked in a fresh
interpreter so earlier imports in the test session cannot hide a leak."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "verl", "tinker", "sagemaker", "boto3", "botocore", "ray", "mistral_common")

LIGHT_MODULES = [
    "core",
    "core.types",
    "core.interfaces",
    "core.errors",
    "core.plugins",
    "core.config",
    "core.rollout",
    "core.rundir",
    "core.trainer.config",
    "core.tokenizer",
    "core.gateway",
    "core.runtime",
    "core.runtime.ray",
    "core.agent",
]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_imports_no_heavy_dependency(module: str) -> None:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_loading_plugins_imports_no_heavy_dependency() -> None:
    """Listing backends must not import torch even though tracerl-local needs it."""
    code = (
        "import json, sys\n"
        "from core.plugins import load_plugins\n"
        "p = load_plugins()\n"
        "assert 'local' in p.backends, p.backends.names()\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_a_gateway_with_the_tiny_tokenizer_does_not_import_torch() -> None:
    """What ``python -m core.gateway`` builds by default (tokenizer, scripted sampler, gateway,
    ASGI app, a parsed request) stays free of torch. A tokenizer loaded by name or path:
    ``tests/test_tokenizer_loading.py``."""
    code = (
        "import json, sys\n"
        "from core.tokenizer import load_tokenizer\n"
        "from core.gateway import Gateway\n"
        "from core.gateway.app import build_app, parse_body\n"
        "from core.samplers import ScriptedSampler, encode_reply\n"
        "tok = load_tokenizer('tiny')\n"
        "gw = Gateway(tokenizer=tok, sampler=ScriptedSampler(default=encode_reply(tok, 'hi'), tokenizer=tok))\n"
        "build_app(gw)\n"
        "parse_body(b'{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}')\n"
        "print(json.dumps(sorted(m for m in ('torch',) if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_building_runtime_ray_does_not_import_ray() -> None:
    """``runtime=ray`` composes and builds without ray (optional extra ``tracerl[ray]``):
    ray is imported by ``start()`` only."""
    code = (
        "import json, sys\n"
        "from core.testing import build_runtime\n"
        "rt = build_runtime('ray', ['task.agent=core.testing.conformance_agent:app'])\n"
        "assert type(rt).__name__ == 'RayRuntime'\n"
        "print(json.dumps(sorted(m for m in ('ray',) if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []

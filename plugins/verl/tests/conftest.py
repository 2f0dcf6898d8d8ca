"""Fixtures of the verl plugin's tests, and their collection guard.

The plugin's tests need verl 0.9.1, which lives in its own virtual
environment (``plugins/verl/scripts/setup_venv.sh``; verl caps transformers
below the version the rest of tracerl uses). Under any other interpreter
this directory is not collected at all (``collect_ignore_glob``), so the
system-Python run neither fails on the import nor reports skips; run the
plugin's tests with ``plugins/verl/scripts/run_tests.sh``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).parent

if importlib.util.find_spec("verl") is None:
    collect_ignore_glob = ["*"]
else:
    # The test agents are imported by agent processes (task.agent_env adds this
    # folder to PYTHONPATH) and by the tests themselves.
    sys.path.insert(0, str(HERE / "agents"))
    import warnings

    # verl and Ray emit deprecation noise at import time (ray.experimental.state);
    # import them once here, outside pytest's filterwarnings=error, so the tests
    # still fail on warnings raised by our own code.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import verl.experimental.agent_loop.agent_loop  # noqa: F401
        import verl.trainer.ppo.v1.trainer_base  # noqa: F401
        import verl.workers.rollout.llm_server  # noqa: F401

    from verl_fixtures import *  # noqa: F403,E402

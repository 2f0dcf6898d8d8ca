"""An agent that starts two helper processes at import, as agents with tools do.

One helper stays in the agent's process group; the other calls ``setsid`` (as
sandboxes and language servers often do) and so leaves it. Their pids go to
the file named by ``TRACERL_TEST_CHILD_PIDS``. Served in real agent processes
by the orphan test (never imported by pytest).
"""

from __future__ import annotations

import os
import subprocess
import sys

from core.agent import AgentApp

_SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
_pids_file = os.environ["TRACERL_TEST_CHILD_PIDS"]
_helpers = [
    subprocess.Popen(_SLEEP, stdin=subprocess.DEVNULL),
    subprocess.Popen(_SLEEP, stdin=subprocess.DEVNULL, start_new_session=True),
]
with open(f"{_pids_file}.tmp", "w") as fh:
    fh.write(" ".join(str(p.pid) for p in _helpers))
os.replace(f"{_pids_file}.tmp", _pids_file)

app = AgentApp()


@app.entrypoint
def handler(payload: dict) -> dict:
    return {"reward": 1.0}

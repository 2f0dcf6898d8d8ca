"""``python -m core.gateway`` in a child process, for the tests that need a real one (its
imports, its event loop, its memory): started, read, and always stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def served_gateway(*args: str, **popen: Any) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """Serve ``python -m core.gateway ARGS``; yields the process and its startup line (``base_url``,
    ``root_url``, ``sessions``, ``admin_token``, ...). ``popen`` goes to ``subprocess.Popen``."""
    proc = subprocess.Popen([sys.executable, "-m", "core.gateway", *args], stdout=subprocess.PIPE, text=True, **popen)
    try:
        assert proc.stdout is not None
        yield proc, json.loads(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

"""A process's memory as Linux reports it in ``/proc/<pid>/status``, for the tests that bound it.

Memory figures (unlike timings) do not depend on the machine's load, so tests may bound them.
``VmHWM`` is the peak resident set since the process started; ``VmRSS`` the current one.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["peak_mb", "status_kib"]


def status_kib(pid: int, field: str) -> int:
    """The ``field`` line (``VmHWM``, ``VmRSS``, ...) of ``/proc/<pid>/status``, in KiB.

    Raises:
        AssertionError: the file has no such line.
    """
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def peak_mb(pid: int) -> float:
    """Process ``pid``'s peak resident memory since it started (``VmHWM``), in MB (MiB)."""
    return status_kib(pid, "VmHWM") / 1024

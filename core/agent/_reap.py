"""Find and kill the processes an agent started, including those that left its group.

Defines ``descendants`` (pids below a process, read from ``/proc``) and
``kill_tree``. Agents start tools, sandboxes and language servers; some of them
call ``setsid`` and so escape a ``killpg`` of the agent's group. Walking the
parent links catches those too. Linux only (``/proc``); elsewhere ``descendants``
is empty and only the process group is killed. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal


def descendants(root: int) -> list[int]:
    """Pids of every live process below ``root`` (children first), from ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 2 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    """Signal each pid, ignoring those already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_tree(root: int, *, group: bool = True) -> None:
    """SIGKILL everything below ``root``, then ``root``'s process group if it leads one.

    Several passes catch a child that forked while we were killing its parent.
    With ``root`` the calling process and ``group`` true, the caller dies too.
    """
    for _ in range(3):
        pids = descendants(root)
        if not pids:
            break
        kill_pids(pids)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(root) == root:
                os.killpg(root, signal.SIGKILL)

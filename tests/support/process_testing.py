"""Reading the process table from /proc: a sandbox's processes run below its bwrap."""

from __future__ import annotations

import os
from pathlib import Path


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, queue = [pid], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def exited(pid: int) -> bool:
    """The process is gone (or a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its descendants."""
    total = 0.0
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total

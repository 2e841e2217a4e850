"""A process named for good: its start time since boot, read from ``/proc``.

With the pid, the start time names one process even after the kernel gives its pid to another one. Lease
holders (engine/owner.py) and the local provider's temp-file writers (providers/local/layout.py) both rely
on it; it lives below both layers, importing nothing of the package, so neither needs a copy.
"""

from __future__ import annotations

__all__ = ["process_start"]


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), or
    None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count fields after the last ")".
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()

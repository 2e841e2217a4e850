"""Who holds a lease: worker ids that name a process for good, so a dead holder can be recognised.

A worker id is ``<host>:<pid>:<start>:<nonce>``: ``start`` is the process's start time in clock ticks
since boot (field 22 of ``/proc/<pid>/stat``), so a pid the kernel has since given to another process is
not mistaken for the holder. On the holder's own host, a holder whose pid is gone (or now names a process
started at another time) is dead for certain, and its lease can be taken over at once instead of after
its TTL. Nothing is concluded about other hosts, or about ids in any other form (caller-chosen ids):
those leases are waited out.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from durable_sandbox.process_identity import process_start


def new_worker_id() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process_start(pid) or 0}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start: str

    @classmethod
    def parse(cls, owner: str) -> Holder | None:
        parts = owner.split(":")
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), parts[2])

    def dead(self) -> bool:
        """True only when certain: the holder ran on this host and that process no longer exists."""
        return self.host == socket.gethostname() and process_start(self.pid) != self.start

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}"


def holder_is_dead(owner: str | None) -> bool:
    holder = Holder.parse(owner) if owner else None
    return holder is not None and holder.dead()


def describe_owner(owner: str) -> str:
    holder = Holder.parse(owner)
    return f"worker {owner!r}" if holder is None else f"worker {owner!r} ({holder.describe()})"

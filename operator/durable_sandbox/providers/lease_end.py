"""When a process takes a sandbox's lease to have run out, for providers whose lease lives on an object that
people other than the operator may edit (a Pod's annotation, a SandboxClaim's spec).

Anyone who may patch Pods in a namespace can rewrite a sandbox Pod's lease annotation, and a seal over it would
not help: an older sealed value, put back, is a genuine lease that ran out. So the written lease may only make
the end *later* (another process of the operator renewed it), never earlier: the floor is what this process
granted or renewed itself, or, for a sandbox it never leased (after a restart), its first sight of it plus the
sandbox's own lease length (sealed with the sandbox's description) — a sandbox nobody renews is still deleted, at
most one lease after the process first saw it. A lease written far into the future only keeps the sandbox from
this backstop; what the operator records (finalizers, the orphan sweep's sealed records) still deletes it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LeaseEnds"]


class LeaseEnds:
    """One process's view of its sandboxes' lease ends: what it granted or renewed, and when it first saw the
    others (by id and uid: a Pod made again under the name is seen anew)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._granted: dict[str, float] = {}
        self._first_seen: dict[tuple[str, str], float] = {}

    def granted(self, sandbox_id: str, expires: float) -> None:
        """This process provisioned or renewed the sandbox's lease until ``expires``."""
        self._granted[sandbox_id] = expires

    def forget(self, sandbox_id: str) -> None:
        self._granted.pop(sandbox_id, None)
        for key in [k for k in self._first_seen if k[0] == sandbox_id]:
            del self._first_seen[key]

    def known(self, sandbox_id: str) -> float | None:
        return self._granted.get(sandbox_id)

    def end(self, sandbox_id: str, uid: str, written: float | None, lease_seconds: float) -> float:
        """The lease's end as this process believes it: the later of its floor and the ``written`` one."""
        floor = self._granted.get(sandbox_id)
        if floor is None:
            floor = self._first_seen.setdefault((sandbox_id, uid), self._clock()) + lease_seconds
        return max(floor, written or 0.0)

    def ran_out(self, sandbox_id: str, uid: str, written: float | None, lease_seconds: float) -> bool:
        return self._clock() >= self.end(sandbox_id, uid, written, lease_seconds)

"""A worker process for the KubernetesStore fencing test: claims a run and commits one record at a time
until the store refuses (LeaseLost), then reports what it committed. Driven over stdin/stdout:

    python -m tests.e2e.store_worker NAMESPACE RUN_ID OWNER

prints ``claimed <fence>``, then waits for a line on stdin before each commit (so the test decides
exactly when each happens: no timing luck), printing ``committed <op_id> <seq>`` or ``lost <op_id>``;
after a loss it tries renew and release and prints ``renew lost`` / ``released``, then exits 0.
With ``--thread-state`` it makes one commit carrying thread state instead, and exits.
"""

from __future__ import annotations

import asyncio
import sys

from durable_sandbox.engine.errors import LeaseLost
from durable_sandbox.engine.records import Commit, OperationRecord
from durable_sandbox.kube.store import KubernetesStore
from tests.e2e.store_support import TEST_JOURNAL_KEY


async def main(namespace: str, run_id: str, owner: str, thread_state: bool = False) -> None:
    store = await KubernetesStore.connect(namespace, journal_key=TEST_JOURNAL_KEY)
    try:
        lease = await store.claim(run_id, owner, 30)
        print(f"claimed {lease.fence}", flush=True)
        if thread_state:  # one commit carrying thread state (a crash test kills us inside it)
            rec = OperationRecord("with-state", "step", "fn", "completed", 1, None, "done")
            await store.commit(run_id, lease.fence, Commit([rec], thread_state=("shared-thread", {"n": 1})))
            print("committed with-state", flush=True)
            return
        loop = asyncio.get_running_loop()
        i = 0
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            i += 1
            op_id = f"{owner}-{i}"
            try:
                rec = OperationRecord(op_id, "step", "fn", "completed", 1, None, {"i": i})
                await store.commit(run_id, lease.fence, Commit([rec]))
            except LeaseLost:
                print(f"lost {op_id}", flush=True)
                break
            print(f"committed {op_id} {rec.seq}", flush=True)
        try:
            await store.renew(lease, 30)
            print("renew ok", flush=True)
        except LeaseLost:
            print("renew lost", flush=True)
        await store.release(lease)
        print("released", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4], thread_state="--thread-state" in sys.argv[4:]))

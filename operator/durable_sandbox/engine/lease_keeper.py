"""What keeps an execution's lease while it runs: renew it every third of its TTL, and notice a cancel that
another process asked for through the store.

A lost lease cancels the execution here (another worker may have the run now); a refused renewal or a failed
read is not a lost lease and the keeper goes on (the fence decides who may write).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from durable_sandbox.engine.errors import LeaseLost, StoreRefused
from durable_sandbox.engine.records import Lease
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.store import Store

log = logging.getLogger("durable_sandbox.engine")


async def keep_lease(store: Store, lease: Lease, ttl: float, rt: RunRuntime, wf: asyncio.Task[Any],
                     cancel_once: Callable[[], None]) -> None:
    """Renew ``lease`` until cancelled; cancel ``wf`` when the lease is lost, ``cancel_once`` on a user cancel."""
    interval = max(ttl / 3, 0.05)
    while True:
        await asyncio.sleep(interval)
        try:
            lease = await store.renew(lease, ttl)
        except LeaseLost:
            log.error("lease on run %s lost; cancelling its execution here", lease.run_id)
            wf.cancel()
            return
        except StoreRefused as exc:
            # Refused, not lost: the run may be held at a refused commit (engine/refusals.py), and a keeper
            # that ended here would let the lease lapse under it. Keep renewing; the fence decides.
            log.warning("run %s: renewing its lease was refused (%s); trying again in %.1fs",
                        lease.run_id, exc, interval)
            continue
        try:
            run = await store.get_run(lease.run_id)
        except Exception as exc:
            # Only a failed renewal means the lease is lost. A failed read (the store away for a moment)
            # must not end the keeper: the lease would then lapse while the run goes on executing here,
            # and the replica that takes the run over would execute it alongside. The next poll reads again.
            log.warning("run %s: could not read it to look for a cancel (%s); looking again in %.1fs",
                        lease.run_id, exc, interval)
            continue
        if run is not None and run.cancel_requested and rt.cancel_reason is None:
            rt.cancel_reason = run.cancel_requested
            cancel_once()

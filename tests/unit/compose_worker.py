"""A process of its own for the composition crash tests (a fault point SIGKILLs it):

    python compose_worker.py <store location> run <run_id> <workflow> <log> [<input json>]   a new run of <workflow>
    python compose_worker.py <store location> resume <run_id>                 resume an existing run

The store location is a SQLite path or a postgresql:// URL (stores/locations.py); the workflows are
tests/unit/composition_flows.py's; the engine is ``durable_sandbox.Engine`` (sandbox sessions on the local
provider under $DURABLE_SANDBOX_HOME)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from durable_sandbox import Engine
from durable_sandbox.stores.locations import open_store

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.unit import composition_flows  # registers the compose-* workflows

assert composition_flows


async def main(argv: list[str]) -> int:
    location, mode, run_id = argv[:3]
    store = await open_store(location)
    engine = Engine(store, lease_ttl=30)  # its worker id names this process: a dead one is taken over at once
    try:
        if mode == "run":
            workflow_name, log = argv[3:5]
            extra = json.loads(argv[5]) if len(argv) > 5 else {}
            state = await engine.run(workflow_name, {"log": log, **extra}, run_id=run_id)
        else:
            state = await engine.resume(run_id)
        print(json.dumps({"status": state.status, "result": state.result}))
    finally:
        await engine.aclose()
        await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

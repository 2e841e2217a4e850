"""Child process for the crash-safety tests.

    python crash_worker.py run <db> <run_id> <workflow> <log>   drive a new run of <workflow>
    python crash_worker.py resume <db> <run_id>                   resume an existing run

The crash point comes from DURABLE_SANDBOX_FAULT (before:/inside:/after:<op_id>[@n]), read by the engine
at import; ``CRASH_WORKER_DIE_IN=<step>`` kills the process inside that step's function, after its side
effect and before it returns. ``CRASH_WORKER_CLOCK_SKEW=<seconds>`` shifts the store's clock so that a
resuming process sees the dead process's lease as expired without anyone waiting for it.

Every step appends its name to the log file (opened, written and closed: in the kernel before the step
returns), so the tests count side effects from the file, not from the engine's journal.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sys
import time
import types

from durable_sandbox.engine import Engine, RetryPolicy, workflow
from durable_sandbox.stores import SqliteStore


def effect(log: str, name: str) -> str:
    with open(log, "a") as f:
        f.write(name + "\n")
    if os.environ.get("CRASH_WORKER_DIE_IN") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    return name.upper()


def flaky(log: str, name: str) -> str:
    """Fails the first time it ever runs (judged from the log), succeeds after."""
    with open(log) as f:
        seen = f.read().split().count(name)
    effect(log, name)
    if seen == 0:
        raise RuntimeError("first attempt fails")
    return name.upper()


@workflow(name="crash-seq")
async def crash_seq(ctx, inp: dict) -> list[str]:
    out = []
    for name in ("s1", "s2", "s3"):
        out.append(await ctx.step(name, effect, inp["log"], name))
    return out


async def effect_at_once(log: str, name: str) -> str:
    """An async step function that completes without suspending: its start and outcome share one commit."""
    return effect(log, name)


async def effect_after_a_suspension(log: str, name: str) -> str:
    """An async step function that suspends first: its start is committed before it goes on."""
    await asyncio.sleep(0)
    return effect(log, name)


@workflow(name="crash-seq-async-at-once")
async def crash_seq_async_at_once(ctx, inp: dict) -> list[str]:
    return [await ctx.step(name, effect_at_once, inp["log"], name) for name in ("s1", "s2", "s3")]


@workflow(name="crash-seq-async-suspending")
async def crash_seq_async_suspending(ctx, inp: dict) -> list[str]:
    return [await ctx.step(name, effect_after_a_suspension, inp["log"], name) for name in ("s1", "s2", "s3")]


@workflow(name="crash-par")
async def crash_par(ctx, inp: dict) -> dict:
    first = await ctx.step("first", effect, inp["log"], "first")
    branches = {k: functools.partial(effect, inp["log"], f"p/{k}") for k in ("a", "b", "c")}
    out = await ctx.parallel("p", branches)
    return {"first": first, **out}


@workflow(name="crash-retry")
async def crash_retry(ctx, inp: dict) -> str:
    await ctx.step("s1", effect, inp["log"], "s1")
    return await ctx.step(
        "r", flaky, inp["log"], "r", retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=False)
    )


def _skew_clock() -> None:
    skew = float(os.environ.get("CRASH_WORKER_CLOCK_SKEW") or 0)
    if skew:
        import durable_sandbox.stores.sqlite_file as sqlite_mod

        sqlite_mod.time = types.SimpleNamespace(time=lambda: time.time() + skew)  # type: ignore[assignment]


async def main(argv: list[str]) -> int:
    _skew_clock()
    mode, db, run_id = argv[:3]
    store = SqliteStore(db)
    engine = Engine(store, worker_id=f"crash-worker-{os.getpid()}", lease_ttl=30)
    try:
        if mode == "run":
            workflow_name, log = argv[3:5]
            state = await engine.run(workflow_name, {"log": log}, run_id=run_id)
        else:
            state = await engine.resume(run_id)
        print(json.dumps({"status": state.status, "result": state.result}))
    finally:
        await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

"""The workflow the trace tests run (unit, with the SDK's in-memory exporter; e2e, through the test collector):
a step, a sandbox with a snapshot every two calls and a loss injected after the third (so a restore from the
snapshot replays the third call), then a callback, so the run has two attempts."""

from __future__ import annotations

from typing import Any

import durable_sandbox as ds


def plan() -> str:
    return "plan"


@ds.workflow(name="tests.tracing.lossy")
async def lossy(ctx: ds.Context) -> dict[str, Any]:
    await ctx.step("plan", plan)
    async with ctx.sandbox("ws", provider="local", snapshot_every=2, inject_loss_after=3) as sbx:
        await sbx.write_file("a.txt", "a\n", operation_id="write")
        await sbx.shell("cat a.txt", operation_id="cat")
        await sbx.shell('printf %s "$TRACEPARENT" > tp.txt', operation_id="traceparent")
        seen = await sbx.read_file("tp.txt", operation_id="read")
    verdict = await ctx.callback("approve")
    return {"traceparent": seen.stdout, "verdict": verdict}


# What one span is, however it was read back (SDK objects or the collector's OTLP JSON).
Span = dict[str, Any]  # {"name", "trace", "id", "parent", "attributes", "events": [names], "links": [span ids]}


def check_lossy_trace(spans: list[Span], caller_trace: str, caller_span: str) -> None:
    """The trace of :func:`lossy` run with a caller's traceparent, signalled, then resumed: the shape issue 40's
    acceptance asks for."""
    assert {s["trace"] for s in spans} == {caller_trace}, "every span is in the caller's trace"
    by_id = {s["id"]: s for s in spans}
    runs = [s for s in spans if s["name"] == "run tests.tracing.lossy"]
    assert len(runs) == 2, f"one span per attempt: {[s['name'] for s in spans]}"
    first, second = sorted(runs, key=lambda s: s["attributes"]["durable_sandbox.run.resumed"])
    assert first["parent"] == caller_span and second["parent"] == caller_span, "the caller's span is the parent"
    assert second["links"] == [first["id"]], "the resumed attempt links to the attempt before it"

    def children(parent: Span, name: str | None = None) -> list[Span]:
        return [s for s in spans if s["parent"] == parent["id"] and (name is None or s["name"] == name)]

    def one(parent: Span, name: str) -> Span:
        found = children(parent, name)
        assert len(found) == 1, f"{name} under {parent['name']}: {[s['name'] for s in children(parent)]}"
        return found[0]

    assert [s["name"] for s in children(first)][:2] == ["step plan", "sandbox.provision"]
    calls = children(first, "sandbox.call shell") + children(first, "sandbox.call write_file") \
        + children(first, "sandbox.call read_file")
    assert sorted(c["attributes"]["durable_sandbox.operation.id"] for c in calls) == \
        ["ws/cat", "ws/read", "ws/traceparent", "ws/write"]
    assert all(c["attributes"]["process.exit.code"] == 0 and c["attributes"]["durable_sandbox.replay"] is False
               for c in calls)
    cat = next(c for c in calls if c["attributes"]["durable_sandbox.operation.id"] == "ws/cat")
    assert one(cat, "sandbox.snapshot")["attributes"]["durable_sandbox.snapshot.count"] == 2
    third = next(c for c in calls if c["attributes"]["durable_sandbox.operation.id"] == "ws/traceparent")
    loss = one(third, "sandbox.loss")
    assert loss["attributes"]["durable_sandbox.loss.reason"] == "loss injected"
    restore = one(loss, "sandbox.restore")
    assert restore["attributes"]["durable_sandbox.restore.replayed"] == 1
    replay = one(restore, "sandbox.call shell")
    assert replay["attributes"]["durable_sandbox.replay"] is True
    assert replay["attributes"]["durable_sandbox.operation.id"] == "ws/traceparent"
    assert children(first, "callback approve")[0]["attributes"]["durable_sandbox.outcome"] == "waiting"
    assert first["attributes"]["durable_sandbox.outcome"] == "waiting"

    # The resumed attempt: the journal answers the step and the calls (events, not spans); the callback runs.
    assert [s["name"] for s in children(second)] == ["callback approve"]
    assert "durable_sandbox.replayed" in second["events"]
    assert second["attributes"]["durable_sandbox.outcome"] == "completed"
    assert all(s["parent"] in by_id or s["parent"] == caller_span for s in spans), "no orphan span"

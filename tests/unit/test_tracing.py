"""Traces (issue 40) with the OpenTelemetry SDK's in-memory exporter: the spans of a run with a sandbox loss,
their parent-child structure, the caller's traceparent as the parent, ``TRACEPARENT`` in a sandbox call's env;
tracing off imports nothing of OpenTelemetry. The same run through a real collector: tests/e2e/test_traces.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durable_sandbox as ds
from durable_sandbox.engine.extensions import Extensions
from durable_sandbox.engine.traced import caller_labels
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
from durable_sandbox.tracing import TRACEPARENT_LABEL, Tracing, valid_traceparent
from durable_sandbox.tracing.api import enabled
from tests.unit.tracing_support import Span, check_lossy_trace, lossy

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def as_span(s: ReadableSpan) -> Span:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "name": s.name, "trace": f"{ctx.trace_id:032x}", "id": f"{ctx.span_id:016x}",
        "parent": f"{s.parent.span_id:016x}" if s.parent is not None else None,
        "attributes": dict(s.attributes or {}), "events": [e.name for e in s.events],
        "links": [f"{link.context.span_id:016x}" for link in s.links],
    }


def traced_engine(tmp_path: Path) -> tuple[Any, InMemorySpanExporter, LocalProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    local = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": local},
                       extensions=[Tracing.opentelemetry(provider)])
    return engine, exporter, local


async def test_a_run_with_a_loss_is_one_trace_under_the_callers_span(tmp_path: Path) -> None:
    engine, exporter, local = traced_engine(tmp_path)
    state = await engine.run(lossy, run_id="t1", labels={TRACEPARENT_LABEL: CALLER})
    assert state.status == "waiting", state.error
    await engine.signal("t1", "approve", "yes")
    state = await engine.resume("t1")
    assert state.status == "succeeded", state.error
    spans = [as_span(s) for s in exporter.get_finished_spans()]
    check_lossy_trace(spans, CALLER_TRACE, CALLER_SPAN)
    # The call saw TRACEPARENT: the span of the execution that wrote the file (the replay into the replacement).
    seen = valid_traceparent(state.result["traceparent"])
    assert seen is not None, state.result
    replay = next(s for s in spans if s["attributes"].get("durable_sandbox.replay") is True)
    assert seen == f"00-{CALLER_TRACE}-{replay['id']}-01"
    history = await engine.history("t1")
    assert not any(CALLER_TRACE in str(r.meta) or "env" in ((r.meta or {}).get("call") or {}).get("args", {})
                   for r in history), "the journal never holds the injected env"
    assert local.leftovers() == []
    await engine.aclose()


async def test_without_a_caller_each_attempt_is_a_root_linked_to_the_one_before(tmp_path: Path) -> None:
    engine, exporter, _ = traced_engine(tmp_path)
    assert (await engine.run(lossy, run_id="t2")).status == "waiting"
    await engine.signal("t2", "approve", "yes")
    assert (await engine.resume("t2")).status == "succeeded"
    runs = [as_span(s) for s in exporter.get_finished_spans() if s.name.startswith("run ")]
    assert [r["parent"] for r in runs] == [None, None]
    assert runs[1]["links"] == [runs[0]["id"]] and runs[0]["links"] == []
    await engine.aclose()


def test_the_callers_traceparent_comes_from_its_labels_its_span_or_the_env() -> None:
    off = Extensions()
    assert caller_labels(off, None, {"TRACEPARENT": CALLER}) is None, "tracing off: labels untouched"
    on = Extensions([Tracing.opentelemetry(TracerProvider())])
    assert caller_labels(on, None, {"TRACEPARENT": CALLER}) == {TRACEPARENT_LABEL: CALLER}
    given = {TRACEPARENT_LABEL: "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    assert caller_labels(on, given, {"TRACEPARENT": CALLER}) == given
    assert caller_labels(on, {"a": "b"}, {"TRACEPARENT": "garbage"}) == {"a": "b"}, "a malformed one is ignored"
    assert valid_traceparent("00-" + "0" * 32 + "-" + "2" * 16 + "-01") is None, "an all-zero trace id is invalid"


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_opentelemetry_environment_turns_tracing_on(env: dict[str, str], on: bool) -> None:
    assert enabled(env) is on
    assert (Tracing.from_env(env) is not None) is on


def test_tracing_off_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, sys
        import durable_sandbox as ds
        from durable_sandbox.providers.local import LocalProvider
        from durable_sandbox.stores import SqliteStore

        @ds.workflow(name="off")
        async def flow(ctx):
            await ctx.step("a", lambda: 1)
            async with ctx.sandbox("ws", provider="local") as sbx:
                await sbx.shell("true")
            return 1

        async def main():
            engine = ds.Engine(SqliteStore({str(tmp_path / 'runs.db')!r}),
                               providers={{"local": LocalProvider({str(tmp_path / 'home')!r})}})
            state = await engine.run(flow)
            await engine.aclose()
            assert state.status == "succeeded", state.error
            loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
            assert not loaded, loaded

        asyncio.run(main())
    """)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_workflow_annotation_becomes_the_runs_caller() -> None:
    from durable_sandbox.tracing import TRACEPARENT_ANNOTATION, annotated_caller

    assert annotated_caller({TRACEPARENT_ANNOTATION: CALLER}) == {TRACEPARENT_LABEL: CALLER}
    assert annotated_caller({TRACEPARENT_ANNOTATION: "not-a-traceparent"}) == {}
    assert annotated_caller(None) == {}


def test_trace_links_take_the_newest_attempt_then_the_caller() -> None:
    from durable_sandbox.tracing import ATTEMPT_LABEL
    from durable_sandbox.tracing.traceparent import trace_link

    ui = "https://jaeger.example/trace/{trace_id}"
    attempt = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert trace_link({TRACEPARENT_LABEL: CALLER}, ui) == f"https://jaeger.example/trace/{CALLER_TRACE}"
    assert trace_link({TRACEPARENT_LABEL: CALLER, ATTEMPT_LABEL: attempt}, ui) == "https://jaeger.example/trace/" + "a" * 32
    assert trace_link({TRACEPARENT_LABEL: CALLER}, None) is None
    assert trace_link({}, ui) is None


async def test_a_store_that_refuses_the_attempts_label_does_not_fail_the_run(tmp_path: Path) -> None:
    class Refusing(SqliteStore):
        async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
            if "labels" in changes:
                raise RuntimeError("quota exceeded")
            await super().update_run(run_id, changes, fence=fence)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = ds.Engine(Refusing(tmp_path / "runs.db"), providers={"local": LocalProvider(tmp_path / "home")},
                       extensions=[Tracing.opentelemetry(provider)])
    assert (await engine.run(lossy, run_id="t3")).status == "waiting"
    await engine.signal("t3", "approve", "yes")
    assert (await engine.resume("t3")).status == "succeeded"
    runs = [as_span(s) for s in exporter.get_finished_spans() if s.name.startswith("run ")]
    assert [r["links"] for r in runs] == [[], []], "no attempt recorded: nothing to link to, and no failure"
    await engine.aclose()


async def test_a_session_call_through_the_call_api_joins_the_callers_trace(tmp_path: Path) -> None:
    import httpx

    from durable_sandbox.sessions.http import create_app
    from tests.unit.sessions_support import local_gate, service

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"),
                  extensions=[Tracing.opentelemetry(provider)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(svc)), base_url="http://sessions") as http:
        ran = await http.post("http://sessions/v1/namespaces/demo/sandboxes/box/shell",
                              headers={"Authorization": "Bearer good-token", "traceparent": CALLER},
                              json={"operationId": "s1", "command": 'printf %s "$TRACEPARENT"'})
    assert ran.status_code == 200, ran.text
    spans = {s["name"]: s for s in (as_span(x) for x in exporter.get_finished_spans())}
    request, call = spans["sandbox.session_call shell"], spans["sandbox.call shell"]
    assert (request["trace"], request["parent"]) == (CALLER_TRACE, CALLER_SPAN), "the header's span is the parent"
    assert call["parent"] == request["id"] and call["attributes"]["durable_sandbox.operation.id"] == "calls/s1"
    assert ran.json()["stdout"] == f"00-{CALLER_TRACE}-{call['id']}-01", "the call saw its own span as TRACEPARENT"


def test_the_client_sends_the_current_span_or_the_env_as_traceparent(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace

    from durable_sandbox.tracing.traceparent import outgoing_traceparent

    monkeypatch.setenv("TRACEPARENT", CALLER)
    assert outgoing_traceparent() == CALLER, "no current span: the environment's (a tool inside a sandbox call)"
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("agent") as span:
        ctx = span.get_span_context()
        assert outgoing_traceparent() == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert trace.get_current_span().get_span_context().is_valid is False

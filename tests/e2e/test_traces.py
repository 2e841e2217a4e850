"""Issue 40's acceptance: `dsb run` exports its spans to a real OpenTelemetry Collector (tests/otelcol), read back
from what the collector wrote. A run with an injected sandbox loss is one trace: provision, calls, a snapshot, the
loss, the restore and the replayed call, with the right parent-child structure; the caller's ``TRACEPARENT`` is
the parent; the resumed attempt (after a signal, in another process) links to the first."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dsb import dsb
from tests.unit.tracing_support import check_lossy_trace

from .controlplane import wait_until
from .trace_support import TraceCollector, running_collector, waterfall_svg

pytestmark = pytest.mark.e2e

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture
def trace_collector(tmp_path: Path) -> Iterator[TraceCollector]:
    with running_collector(tmp_path / "collector") as collector:
        yield collector


def test_dsb_run_with_a_loss_is_one_trace_in_the_collector(trace_collector: TraceCollector, tmp_path: Path) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": trace_collector.endpoint,
        "OTEL_SERVICE_NAME": "dsb-trace-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "TRACEPARENT": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    }
    home, store = tmp_path / "home", tmp_path / "runs.db"
    ran = dsb("run", "tests.unit.tracing_support:lossy", "--run-id", "traced", home=home, store=store, env=env,
              process=True)
    assert "waiting" in ran.output, ran.output
    assert dsb("signal", "traced", "approve", '"yes"', home=home, store=store, process=True).exit_code == 0
    # The resumed attempt runs in another process without TRACEPARENT: the run's labels carry its parent.
    resumed = dsb("resume", "traced", home=home, store=store, process=True,
                  env={k: v for k, v in env.items() if k != "TRACEPARENT"})
    assert resumed.exit_code == 0, resumed.output

    def both_attempts() -> list[dict[str, object]] | None:
        spans = trace_collector.spans()
        return spans if sum(s["name"] == "run tests.tracing.lossy" for s in spans) == 2 else None

    spans = wait_until(both_attempts, 30, "both attempts' spans in the collector's file")
    check_lossy_trace(spans, CALLER_TRACE, CALLER_SPAN)
    if os.environ.get("DSB_TRACE_PICTURE"):  # docs/operations.md's picture: DSB_TRACE_PICTURE=docs/traces/run-loss.svg
        Path(os.environ["DSB_TRACE_PICTURE"]).write_text(waterfall_svg(spans))
    assert {s["service"] for s in spans} == {"dsb-trace-test"}, "OTEL_SERVICE_NAME names the service"

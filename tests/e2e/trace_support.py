"""The test trace backend: an OpenTelemetry Collector (tests/otelcol, built by scripts/otelcol-build and cached)
with an OTLP/HTTP receiver and the file exporter. ``running_collector`` starts one on a free port; its
``spans()`` reads back what it received, as OTLP JSON (one batch a line), flattened to tests/unit/tracing_support's
``Span`` shape."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ports import free_port
from tests.processes import stop_process
from tests.unit.tracing_support import Span

from .controlplane import PROJECT_ROOT, wait_until
from .node_support import _script_output

OTELCOL_SCRIPT = PROJECT_ROOT / "scripts" / "otelcol-build"
READY_TIMEOUT_S = 60.0


def collector_binary() -> Path:
    """scripts/otelcol-build's collector, once per session (the e2e conftest builds it outside any test)."""
    return _script_output(OTELCOL_SCRIPT)


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _value(v: dict[str, Any]) -> Any:
    if "intValue" in v:
        return int(v["intValue"])  # OTLP JSON writes 64-bit integers as strings
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    return None


@dataclass
class TraceCollector:
    endpoint: str  # OTEL_EXPORTER_OTLP_ENDPOINT
    output: Path

    def spans(self) -> list[Span]:
        out: list[Span] = []
        text = self.output.read_text() if self.output.exists() else ""
        for line in text.splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                service = {a["key"]: _value(a["value"]) for a in rs.get("resource", {}).get("attributes", [])}
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        out.append({
                            "name": s["name"], "trace": s["traceId"], "id": s["spanId"],
                            "parent": s.get("parentSpanId") or None,
                            "attributes": {a["key"]: _value(a["value"]) for a in s.get("attributes", [])},
                            "events": [e["name"] for e in s.get("events", [])],
                            "links": [link["spanId"] for link in s.get("links", [])],
                            "service": service.get("service.name"),
                            "start": int(s["startTimeUnixNano"]), "end": int(s["endTimeUnixNano"]),
                        })
        return out


@contextlib.contextmanager
def running_collector(tmp_path: Path) -> Iterator[TraceCollector]:
    """A collector writing to ``tmp_path``, stopped at the end (the ``trace_collector`` fixture of a test)."""
    binary = collector_binary()
    port = free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    output = tmp_path / "traces.jsonl"
    config = tmp_path / "otelcol.yaml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"file": {"path": str(output), "flush_interval": "100ms"}},
        "service": {"telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}}},
    }))
    log = (tmp_path / "otelcol.log").open("wb")
    proc = subprocess.Popen([str(binary), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _listening(port) or proc.poll() is not None, READY_TIMEOUT_S, "the test collector to listen")
        assert proc.poll() is None, (tmp_path / "otelcol.log").read_text()
        yield TraceCollector(f"http://127.0.0.1:{port}", output)
    finally:
        stop_process(proc, 30)
        log.close()


ATTRIBUTES_SHOWN = ("durable_sandbox.operation.id", "process.exit.code", "durable_sandbox.snapshot.count",
                    "durable_sandbox.loss.reason", "durable_sandbox.restore.replayed", "durable_sandbox.outcome")


def waterfall_svg(spans: list[Span]) -> str:
    """The trace as a trace UI draws it (one row per span, indented under its parent, a bar for its time): the
    picture docs/operations.md shows, written by tests/e2e/test_traces.py when ``DSB_TRACE_PICTURE`` names a file."""
    ids = {s["id"] for s in spans}
    rows: list[tuple[int, Span, Span]] = []  # (depth, span, its root: each attempt is drawn on its own time scale)

    def walk(span: Span, depth: int, root: Span) -> None:
        rows.append((depth, span, root))
        for child in sorted((c for c in spans if c["parent"] == span["id"]), key=lambda c: c["start"]):
            walk(child, depth + 1, root)

    for root in sorted((s for s in spans if s["parent"] not in ids), key=lambda s: s["start"]):
        walk(root, 0, root)
    t0, t1 = min(s["start"] for s in spans), max(s["end"] for s in spans)
    label_w, bar_w, row_h = 620, 520, 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 20}" height="{row_h * len(rows) + 30}" '
           'font-family="monospace" font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="4" y="14" fill="#555">trace {spans[0]["trace"]} · {len(spans)} spans · '
           f'{(t1 - t0) / 1e9:.2f} s</text>']
    for i, (depth, s, root) in enumerate(rows):
        y = 24 + i * row_h
        a = s["attributes"]
        shown = " ".join(f"{k.rsplit('.', 1)[-1]}={a[k]}" for k in ATTRIBUTES_SHOWN if k in a)
        replay = " [replay]" if a.get("durable_sandbox.replay") is True else ""
        events = f" +{len(s['events'])} events" if s["events"] else ""
        links = " (linked)" if s["links"] else ""
        took = f" {(s['end'] - s['start']) / 1e6:.0f} ms"
        text = f"{s['name']}{replay}{links}  {shown}{events}{took}"
        scale = bar_w / max(1, root["end"] - root["start"])
        x = label_w + 10 + (s["start"] - root["start"]) * scale
        w = max(2.0, (s["end"] - s["start"]) * scale)
        color = "#d9534f" if s["name"] == "sandbox.loss" else "#f0ad4e" if replay or "restore" in s["name"] else "#5b8def"
        esc = text.replace("&", "&amp;").replace("<", "&lt;")
        out.append(f'<text x="{4 + depth * 14}" y="{y + 13}">{esc}</text>')
        out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{color}"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

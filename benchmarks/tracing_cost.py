"""What tracing costs the engine (issue 40): no-op steps/s with the tracing hooks removed (the package without
them), with tracing off (the hooks look for a Tracing and find none: the default) and on (OpenTelemetry's SDK, a
BatchSpanProcessor, an exporter that drops what it is given, or ``--otlp URL``: the OTLP/HTTP exporter to a
collector). The variants take turns in the same process, repeat after repeat, and the figures are ratios
against the baseline of the same run.

    python benchmarks/tracing_cost.py                 # writes benchmarks/results/tracing_cost.json
    python benchmarks/tracing_cost.py --steps 500 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, fresh_dir, machine_info, print_table, ratio, summarize, write_results
from durable_sandbox.engine import Engine, workflow
from durable_sandbox.engine import context as context_module
from durable_sandbox.stores import SqliteStore
from durable_sandbox.tracing import Tracing

VARIANTS = ("baseline", "off", "on")


async def noop(i: int) -> int:
    return i


@workflow(name="bench.tracing_steps")
async def steps_wf(ctx: Any, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", noop, i)
    return n


@contextlib.contextmanager
def without_hooks() -> Iterator[None]:
    """``Context.step`` as it was before the tracing hook wore it (functools.wraps keeps it as __wrapped__)."""
    cls = context_module.Context
    hooked = cls.step
    cls.step = hooked.__wrapped__  # type: ignore[attr-defined,method-assign]
    try:
        yield
    finally:
        cls.step = hooked  # type: ignore[method-assign]


def tracing_on(otlp: str | None) -> tuple[Tracing, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    exporter: SpanExporter
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=otlp.rstrip("/") + "/v1/traces")
    else:
        exporter = Dropping()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing.opentelemetry(provider), provider


def once(variant: str, n: int, tracing: Tracing, base: str | None) -> float:
    async def go(db: Path) -> float:
        store = SqliteStore(db)
        engine = Engine(store, extensions=[tracing] if variant == "on" else [])
        t0 = time.perf_counter()
        state = await engine.run(steps_wf, n, run_id="r1")
        dt = time.perf_counter() - t0
        assert state.status == "succeeded" and state.result == n, state.status
        await engine.aclose()
        await store.close()
        return dt

    with fresh_dir("tracing", base) as d:
        if variant == "baseline":
            with without_hooks():
                return asyncio.run(go(d / "runs.db"))
        return asyncio.run(go(d / "runs.db"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    tracing, provider = tracing_on(args.otlp)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(args.warmup + args.repeats):
        # Take turns, each repeat in another order, so drift of a shared machine falls on every variant alike.
        order = VARIANTS[i % 3:] + VARIANTS[: i % 3]
        for variant in order:
            dt = once(variant, args.steps, tracing, args.tmp)
            # Untimed: the batch exporter's thread finishes its work now, not during the next variant's run.
            provider.force_flush()
            if i >= args.warmup:
                samples[variant].append(dt)
    provider.force_flush()
    provider.shutdown()
    res: dict[str, Any] = {"steps": args.steps, "repeats": args.repeats, "exporter": args.otlp or "dropping",
                           "machine": machine_info()}
    for variant in VARIANTS:
        t = summarize(samples[variant])
        res[variant] = {"seconds": t, "steps_per_s": args.steps / t["median"]}
    base = res["baseline"]["steps_per_s"]
    res["off_vs_baseline"] = ratio(res["off"]["steps_per_s"], base)
    res["on_vs_baseline"] = ratio(res["on"]["steps_per_s"], base)
    return res


def report(res: dict[str, Any]) -> None:
    rows = [[v, fmt(res[v]["steps_per_s"]), fmt(ratio(res[v]["steps_per_s"], res["baseline"]["steps_per_s"]), "x", 3)]
            for v in VARIANTS]
    print_table(f"no-op steps/s, {res['steps']} steps, median of {res['repeats']} (exporter: {res['exporter']})",
                ["tracing", "steps/s", "vs baseline"], rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--otlp", help="export to this OTLP/HTTP endpoint instead of dropping the spans")
    p.add_argument("--tmp", help="where the stores go (default: the system's temp directory)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "tracing_cost.json")
    args = p.parse_args(argv)
    res = run(args)
    report(res)
    write_results(res, args.out)
    return res


if __name__ == "__main__":
    main()

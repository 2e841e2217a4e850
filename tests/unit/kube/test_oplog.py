"""Issue 24, item 4: the operator's log. Its JSON format, kopf's lines re-leveled where kopf says ERROR of what
it retries by design, and the API server away said once (then at growing intervals), with when it is asked next."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.aio.client.exceptions import ApiException

import durable_sandbox as ds
from durable_sandbox.kube.api.apiserver_away import ApiServerAway, took
from durable_sandbox.kube.api.client import brief
from durable_sandbox.kube.reporting.oplog import JsonFormatter, KopfLines, PoolRetryLines, about, configure
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore


def record(name: str, level: int, message: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(name, level, __file__, 1, message, None, None)
    rec.__dict__.update(extra)
    return rec


def test_json_lines_carry_time_level_logger_message_and_the_workflow_fields_only() -> None:
    rec = record("durable_sandbox.kube.lifecycle", logging.INFO, "ns/wf (run wf-1): started",
                 **about("ns", "wf", "wf-1"), password="hunter2")
    doc = json.loads(JsonFormatter().format(rec))
    assert doc.pop("time").endswith("Z")
    assert doc == {"level": "INFO", "logger": "durable_sandbox.kube.lifecycle", "message": "ns/wf (run wf-1): started",
                   "namespace": "ns", "workflow": "wf", "run": "wf-1"}
    # kopf's per-object records: their k8s_ref names the object.
    ref = {"kind": "Workflow", "name": "hello", "namespace": "demo", "uid": "u"}
    doc = json.loads(JsonFormatter().format(record("kopf.objects", logging.WARNING, "x", k8s_ref=ref)))
    assert (doc["namespace"], doc["workflow"]) == ("demo", "hello")
    ref = {"kind": "Sandbox", "name": "box", "namespace": "demo"}
    assert json.loads(JsonFormatter().format(record("kopf.objects", logging.WARNING, "x", k8s_ref=ref)))["object"] == "Sandbox/box"


def test_json_puts_a_traceback_inside_the_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, __import__("sys").exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def test_asyncpg_retrying_its_pool_is_one_warning_line_without_a_traceback() -> None:
    """A PostgreSQL restart: asyncpg's pool logs its retry with a traceback (the store says it is unreachable)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(PoolRetryLines())
    try:
        raise ConnectionError("the database system is shutting down")
    except ConnectionError:
        rec = logging.LogRecord("asyncpg.pool", logging.WARNING, __file__, 1, "Failed to restore the pool connection "
                                "floor; retrying", None, __import__("sys").exc_info())
    handler.handle(rec)
    assert out.getvalue() == ("Failed to restore the pool connection floor; retrying (ConnectionError: the database "
                              "system is shutting down)\n")
    try:
        raise ValueError("a bug")
    except ValueError:  # an ERROR keeps its traceback
        rec = logging.LogRecord("asyncpg.pool", logging.ERROR, __file__, 1, "x", None, __import__("sys").exc_info())
    handler.handle(rec)
    assert "Traceback (most recent call last)" in out.getvalue()


class Away(ApiServerAway):
    def __init__(self) -> None:
        super().__init__()
        self.reports: list[str] = []

    def failed(self, where: str) -> None:
        self.reports.append(where)


RETRY = ("Request attempt #2/9 failed; will retry: GET https://10.0.0.1:6443/apis/durable-sandbox.dev/v1alpha1/"
         "namespaces/demo/workflows?watch=true -> APITooManyRequestsError('storage is (re)initializing', {})")


@pytest.mark.parametrize("verbose", [False, True])
def test_kopf_retries_are_reported_not_written_and_temporary_failures_are_warnings(verbose: bool) -> None:
    away = Away()
    lines = KopfLines(logging.INFO if verbose else logging.WARNING, away)
    assert not lines.filter(record("kopf._cogs.clients.watching", logging.ERROR, RETRY))
    assert away.reports == ["kopf's GET /apis/durable-sandbox.dev/v1alpha1/namespaces/demo/workflows"]
    escalating = RETRY.replace("#2/9 failed; will retry", "#9/9 failed; escalating")
    assert not lines.filter(record("kopf._cogs.clients.watching", logging.ERROR, escalating))
    # A 403 is retried by kopf too, but it is no API server away: kopf's line stays.
    forbidden = RETRY.replace("APITooManyRequestsError", "APIForbiddenError")
    assert lines.filter(record("kopf._cogs.clients.watching", logging.ERROR, forbidden))

    temporary = record("kopf.objects", logging.ERROR, "Handler 'delete' failed temporarily: run x is still stopping")
    assert lines.filter(temporary) and (temporary.levelno, temporary.levelname) == (logging.WARNING, "WARNING")
    failed = record("kopf.objects", logging.ERROR, "Handler 'delete' failed with an exception. Will retry.")
    assert lines.filter(failed) and failed.levelname == "ERROR"  # a real handler failure stays an ERROR
    assert lines.filter(record("kopf.activities", logging.INFO, "Initial authentication")) is verbose
    assert lines.filter(record("durable_sandbox.kube.x", logging.DEBUG, "ours: the root logger's level decides"))


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    configure("text", stream=stream)
    try:
        yield stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def failing(times: int, exc: BaseException) -> tuple[list[int], object]:
    calls: list[int] = []

    async def probe() -> object:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return None

    return calls, probe


async def test_away_is_one_warning_with_the_next_try_then_one_info(captured: io.StringIO) -> None:
    away = ApiServerAway(first_delay=0.01, max_delay=0.02, first_reminder=3600)
    calls, probe = failing(3, ApiException(status=503, reason="Service Unavailable"))
    away.configure(probe)  # type: ignore[arg-type]
    for _ in range(5):  # every part that meets it reports; the probe is one
        away.failed("a status patch")
    assert away._task is not None
    await asyncio.wait_for(away._task, 5)
    lines = captured.getvalue().splitlines()
    assert len(calls) == 4 and len(lines) == 2, lines
    assert "WARNING durable_sandbox.kube.apiserver: the API server does not answer (a status patch: HTTP 503 " \
           "Service Unavailable)" in lines[0] and "asks again in 0.01s, then with a backoff of up to 0.02s" in lines[0]
    assert "INFO durable_sandbox.kube.apiserver: the API server answers again (it did not for " in lines[1]
    assert away.away_since is None
    await away.aclose()


async def test_a_blip_the_probe_gets_past_at_once_says_nothing(captured: io.StringIO) -> None:
    away = ApiServerAway()
    _, probe = failing(0, RuntimeError("never"))
    away.configure(probe)  # type: ignore[arg-type]
    away.failed("kopf's GET /apis")
    assert away._task is not None
    await asyncio.wait_for(away._task, 5)
    assert captured.getvalue() == ""


async def test_a_long_outage_is_reminded_at_growing_intervals_not_every_try(captured: io.StringIO) -> None:
    now = [0.0]
    away = ApiServerAway(first_delay=0.001, max_delay=0.001, first_reminder=30, max_reminder=60,
                         clock=lambda: now[0])
    calls: list[int] = []

    async def probe() -> object:
        calls.append(1)
        now[0] += 5  # each try "takes" 5 s of the fake clock
        if len(calls) < 40:
            raise aiohttp.ClientConnectionError("connection refused")
        return None

    away.configure(probe)
    away.failed("the orphan sweep")
    assert away._task is not None
    await asyncio.wait_for(away._task, 5)
    warnings = [line for line in captured.getvalue().splitlines() if " WARNING " in line]
    # 40 tries over 200 s: the first, then after 30 s, 60 s, 60 s ... (not 40 lines).
    assert 3 <= len(warnings) <= 6, warnings
    assert "still does not answer after" in warnings[1] and "asking again in 0.001s" in warnings[1]
    await away.aclose()


def test_brief_is_one_line_and_took_reads_as_a_person_would() -> None:
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.body = '{"kind":"Status","message":"storage is (re)initializing","code":429}'
    assert brief(exc) == "HTTP 429 Too Many Requests: storage is (re)initializing"
    assert "\n" not in str(brief(RuntimeError("a\nb")))
    assert (took(4.24), took(185), took(3725)) == ("4.2s", "3m05s", "1h02m")


@ds.workflow(name="tests.oplog.done")
async def done_flow(ctx: ds.Context) -> str:
    async with ctx.sandbox("ws", provider="local") as sbx:
        return (await sbx.shell("echo done")).stdout


class CollectedJournals(SqliteStore):
    """A store whose journals are being collected (the Workflow was deleted: its Journal objects go by owner
    reference, the run's head last): reading one fails."""

    collected = False

    async def load_journal(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        if self.collected:
            raise RuntimeError(f"the journal of {run_id} is gone")
        return await super().load_journal(run_id, *args, **kwargs)


async def test_closing_says_nothing_of_runs_that_finished_or_were_deleted(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    store = CollectedJournals(tmp_path / "runs.db")
    engine = ds.Engine(store, providers={"local": LocalProvider(tmp_path / "home")})
    assert (await engine.run(done_flow, run_id="finished")).status == "succeeded"
    engine.driven.add("deleted")  # driven here, then gone with its Workflow
    store.collected = True
    with caplog.at_level(logging.WARNING):
        await engine.aclose()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_failed_orphan_sweep_is_tried_again_soon_not_after_its_interval(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The first sweep of a start met an API server still initializing and waited the whole interval (300 s)."""
    from durable_sandbox.kube.sweep import sweeper
    from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
    from tests.fakes.kube_client import FakeKubeClient

    monkeypatch.setattr(sweeper, "RETRY_FIRST", 0.01)
    stopped = asyncio.Event()
    rounds: list[str] = []

    class Failing(sweeper.OrphanSweeper):
        async def sweep(self) -> dict[str, Any]:
            rounds.append("sweep")
            if len(rounds) == 1:
                raise ApiException(status=429, reason="Too Many Requests")
            if len(rounds) == 2:
                raise ValueError("a bug, said as a WARNING")
            stopped.set()
            return {}

    swept = Failing(FakeKubeClient(), installation="i", namespaces=[], providers=dict, grace=0,  # type: ignore[arg-type]
                    events=None, metrics=OperatorMetrics(), records=None,  # type: ignore[arg-type]
                    finished_runs=None)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="durable_sandbox.kube.sweep.sweeper"):
        await asyncio.wait_for(swept.run(300, stopped), 5)
    assert rounds == ["sweep"] * 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["orphan sweep failed (ValueError: a bug, said as a WARNING); trying again in 0.02s"]

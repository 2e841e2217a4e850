"""Printing runs, journals and run lists as rich tables (default) or JSON/YAML documents."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import click
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from durable_sandbox.engine import OperationRecord, RunRecord, RunState, RunStatus
from durable_sandbox.engine.children import PARENT_LABEL
from durable_sandbox.engine.continue_as_new import CHAIN, CONTINUED_FROM, GENERATION, next_of
from durable_sandbox.engine.driver import Backoff, RunPolicy, backoff
from durable_sandbox.kube.spec.plan import WORKFLOW_LABEL
from durable_sandbox.runs.settings import Settings
from durable_sandbox.sandboxes import journal, rewind_journal

_STATUS_STYLE: Final[Mapping[str, str]] = {
    "succeeded": "green",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
    "waiting": "cyan",
    "running": "blue",
    "started": "blue",
    "pending": "dim",
    "suspended": "magenta",
    "retrying": "yellow",
}


def is_tty() -> bool:
    return _isatty(sys.stdout)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def console(*, stderr: bool = False, wide: bool = False) -> Console:
    """The one console every `dsb` output goes through (tables, progress, outcome lines).

    Markup and emoji codes are off: what we print comes from users, providers and tools (a run id, an
    error such as ``Sandbox provider [e2b] needs an API key``, a command's ``[red]x[/red]`` output), and
    rich would otherwise read brackets as styles and eat them. Styles are applied with ``Text``/``style=``.
    """
    # Resolved per call: click's test runner swaps sys.stdout, and rich must write to the live one.
    stream = sys.stderr if stderr else sys.stdout
    tty = _isatty(stream)
    # Off a terminal rich would wrap tables at 80 columns; piped output reads better unwrapped (and -o wide
    # output not at all: every id whole on its line, for grep).
    return Console(
        file=stream,
        width=None if tty else (100_000 if wide else 160),
        no_color=not tty,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=not tty,
    )


def styled(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, ""))


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return "-"
    seconds = max(end - start, 0.0)
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.1f}s"


def rfc3339(ts: float | None) -> str | None:
    """JSON/YAML times: RFC 3339 in UTC with milliseconds (journal records can be less than 1 ms apart)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def excerpt(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def compact(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return excerpt(text, limit)


def short_id(op_id: str, wide: bool = False) -> str:
    """An op id for a table: long segments (content hashes) cut with an ellipsis; in full with -o wide."""
    if wide:
        return op_id
    return "/".join(part if len(part) <= 14 else part[:10] + "…" for part in op_id.split("/"))


def op_label(name: str, target: str | None) -> str:
    """What an operation is: its name, and for a sandbox call its type and a short excerpt of its command or path."""
    return f"{name}: {excerpt(target, 32)}" if target else name


def workflow_name(workflow: str, labels: dict[str, str], *, wide: bool = False) -> str:
    """The manifest's Workflow name for runs of a manifest (their engine workflow, e.g. sandbox-agent,
    follows in parentheses with -o wide), else the workflow's name."""
    name = labels.get(WORKFLOW_LABEL)
    if not name or name == workflow:
        return workflow
    return f"{name} ({workflow})" if wide else name


def emit_data(settings: Settings, data: Any) -> None:
    if settings.output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n"))
    else:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def op_detail(
    kind: str,
    status: str,
    result: Any,
    error: dict[str, Any] | None,
    meta: dict[str, Any] | None,
    *,
    wide: bool = False,
) -> str:
    """The one thing worth knowing about an operation, for the tables (snapshot ids cut unless ``wide``)."""
    if error:
        return str(error.get("message", ""))
    row = OperationRecord("", kind, "", status, result=result, meta=meta)  # what the sandbox journal reads
    if (outcome := journal.call_outcome(row)) is not None:
        detail = f"exit {outcome['exitCode']}"
        out = (outcome.get("stderr") or outcome.get("stdout") or "").strip().splitlines()
        return f"{detail}: {excerpt(out[0], 60)}" if out else detail
    if journal.finalized(row):
        kept = journal.retained(row)
        return f"finalized; kept snapshot {short_id(kept.snapshot_id, wide)}" if kept else "finalized"
    made = journal.provisioned(row) if kind == journal.PROVISION else None
    if made is not None and made.sandbox_id:
        return f"{made.provider or ''} sandbox {made.sandbox_id}".strip()
    if kind == journal.RESTORE and meta and rewind_journal.META_REWOUND in meta:
        rewound = [str(op).split("/", 1)[-1] for op in meta[rewind_journal.META_REWOUND]]
        return (f"{'rewound' if status == 'completed' else 'rewinding'} to after call {meta.get(rewind_journal.META_TO)}:"
                f" {len(rewound)} call(s) rewound ({excerpt(', '.join(rewound), 60)})")
    if kind == journal.RESTORE and status == "completed":
        source = journal.restored_from(row)
        return f"from {short_id(source, wide) if source else 'a fresh sandbox'}: {journal.replay_summary(row)}"
    if (sandbox_id := journal.destroyed(row)) is not None:
        return f"sandbox {sandbox_id}"
    if (taken := journal.snapshot_taken(row)) is not None:
        return short_id(taken, wide)
    if (deleting := journal.deletion_of(row)) is not None:
        return short_id(deleting, wide)
    if kind == "callback" and status == "started":
        return "waiting for a signal"
    if status == "completed" and result is not None:
        return compact(result, 60)
    return ""


def _add_column(table: Table, name: str, *, wide: bool) -> None:
    # Ids, names and times are short (names are excerpts with an ellipsis): keep them on one line and let
    # the detail, the free text, fold when the table is wider than the terminal. -o wide cuts nothing.
    if name == "Detail" or wide:
        table.add_column(name, overflow="fold", min_width=20)
    else:
        table.add_column(name, no_wrap=True, overflow="ellipsis")


def retry_of(run: RunRecord) -> Backoff | None:
    """The retry a failed run waits for, under the policy recorded with it (`dsb run` records spec.retry): such a
    run is shown as retrying, never as finished."""
    return backoff(run, RunPolicy.of(run))


def state_retry(state: RunState) -> Backoff | None:
    record = RunRecord(state.run_id, state.workflow, status=RunStatus(state.status), created_at=state.created_at,
                       updated_at=state.updated_at, epoch=state.attempt - 1, labels=dict(state.labels))
    return retry_of(record)


def retry_doc(retry: Backoff | None) -> dict[str, Any] | None:
    """``nextAttempt`` of -o json/yaml: the attempt a failed run waits for, of how many, and when it starts."""
    if retry is None:
        return None
    return {"attempt": retry.next, "maxAttempts": retry.of, "at": rfc3339(retry.at)}


def shown_status(status: str, retry: Backoff | None) -> Text:
    return styled("retrying") if retry is not None else styled(status)


def composition_rows(state: RunState) -> list[tuple[str, str]]:
    """How the run relates to others (engine/children.py, engine/continue_as_new.py): its parent, the run it
    continues, the run it continued as, with the chain's first run and the generation."""
    rows = []
    if parent := state.labels.get(PARENT_LABEL):
        rows.append(("Parent", parent))
    if before := state.labels.get(CONTINUED_FROM):
        chain = state.labels.get(CHAIN, before)
        rows.append(("Continued from", f"{before} (chain {chain}, generation {state.labels.get(GENERATION, '?')})"))
    if after := next_of(state.status, state.result):
        rows.append(("Continued as", f"{after} (`dsb inspect {shlex.quote(after)}`)"))
    return rows


def state_table(state: RunState, *, wide: bool = False) -> list[Any]:
    """The renderables `dsb inspect` prints: summary, result/error, pending callbacks, operations."""
    out: list[Any] = []
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("Run", state.run_id)
    summary.add_row("Workflow", workflow_name(state.workflow, state.labels, wide=True))
    retry = state_retry(state)
    summary.add_row("Status", shown_status(state.status, retry))
    if retry is not None:
        summary.add_row("Next attempt", f"{retry.next} of {retry.of} at {fmt_time(retry.at)} (spec.retry; "
                                        f"`dsb resume {shlex.quote(state.run_id)}` starts it now)")
    summary.add_row("Created", fmt_time(state.created_at))
    summary.add_row("Updated", fmt_time(state.updated_at))
    if state.thread_id:
        summary.add_row("Thread", state.thread_id)
    for label, value in composition_rows(state):
        summary.add_row(label, value)
    if state.wake_at:
        summary.add_row("Wakes at", fmt_time(state.wake_at))
    summary.add_row("Recoveries", str(state.recovery_count))
    if state.snapshots:
        summary.add_row("Snapshots", ", ".join(state.snapshots))
    out.append(summary)
    if state.result is not None:
        out.append(Text("\nResult", style="bold"))
        out.append(Text(json.dumps(state.result, indent=2, ensure_ascii=False, default=str)))
    if state.error:
        label = f"Attempt {retry.failed} of {retry.of} failed" if retry is not None else "Error"
        out.append(Text(f"\n{label}: {state.error.get('type')}: {state.error.get('message')}", style="red"))
    if state.pending_callbacks:
        table = Table(title="Pending callbacks", title_justify="left", title_style="bold")
        table.add_column("Callback")
        table.add_column("Payload")
        for cb in state.pending_callbacks:
            table.add_row(cb.id, compact(cb.payload, 100))
        out.append(table)
    ops = Table(title=f"Operations ({len(state.operations)})", title_justify="left", title_style="bold")
    for col in ("Op id", "Kind", "Name", "Status", "Attempt", "Duration", "Detail"):
        _add_column(ops, col, wide=wide)
    for op in state.operations:
        ops.add_row(
            short_id(op.op_id, wide),
            op.kind,
            op_label(op.name, op.target),
            styled(op.status),
            str(op.attempt),
            fmt_duration(op.started_at, op.finished_at),
            op_detail(op.kind, op.status, op.result, op.error, op.meta, wide=wide),
        )
    out.append(ops)
    return out


def render_state(settings: Settings, state: RunState) -> None:
    if settings.output != "table":
        emit_data(settings, state_doc(state))
        return
    con = console(wide=settings.wide)
    for item in state_table(state, wide=settings.wide):
        con.print(item)


def render_history(settings: Settings, run_id: str, rows: list[OperationRecord]) -> None:
    if settings.output != "table":
        emit_data(settings, [record_doc(r) for r in rows])
        return
    targets = {r.op_id: t for r in rows if (t := journal.call_target(r)) is not None}
    table = Table(title=f"History of {run_id} ({len(rows)} records)", title_justify="left", title_style="bold")
    for col in ("Seq", "Time", "Op id", "Kind", "Name", "Status", "Attempt", "Detail"):
        _add_column(table, col, wide=settings.wide)
    for r in rows:
        table.add_row(
            str(r.seq),
            fmt_time(r.ts),
            short_id(r.op_id, settings.wide),
            r.kind,
            op_label(r.name, targets.get(r.op_id)),
            styled(r.status),
            str(r.attempt),
            op_detail(r.kind, r.status, r.result, r.error.to_json() if r.error else None, r.meta, wide=settings.wide),
        )
    console(wide=settings.wide).print(table)


def run_summary(run: RunRecord) -> dict[str, Any]:
    return {
        "runId": run.run_id,
        "workflow": run.workflow,
        "status": run.status.value,
        "stale": run.stale,
        "createdAt": rfc3339(run.created_at),
        "updatedAt": rfc3339(run.updated_at),
        "threadId": run.thread_id,
        "pendingCallbacks": list(run.pending_callbacks),
        "labels": dict(run.labels),
        "error": run.error.to_json() if run.error else None,
        "nextAttempt": retry_doc(retry_of(run)),
    }


def render_runs(settings: Settings, runs: list[RunRecord], *, empty: str = "no runs") -> None:
    if settings.output != "table":
        emit_data(settings, [run_summary(r) for r in runs])
        return
    table = Table(title_justify="left")
    for col in ("Run", "Workflow", "Status", "Created", "Updated", "Waiting on"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(
            r.run_id,
            workflow_name(r.workflow, r.labels, wide=settings.wide),
            _run_status(r),
            fmt_time(r.created_at),
            fmt_time(r.updated_at),
            ", ".join(r.pending_callbacks) if r.status.value == "waiting" else "",
        )
    con = console(wide=settings.wide)
    if runs:
        con.print(table)
    elif empty:
        con.print(empty)


def _run_status(run: RunRecord) -> Text:
    if run.stale:
        return Text("running (stale: its worker is gone)", style="yellow")
    if (retry := retry_of(run)) is not None:
        return Text(f"retrying ({retry.next}/{retry.of} at {fmt_time(retry.at)})", style="yellow")
    return styled(run.status.value)


def kube_age(seconds: float) -> str:
    """An age as kubectl prints it (its HumanDuration): 45s, 3m12s, 95m, 5h3m, 30h, 3d4h, 60d, 2y10d."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    days = hours // 24
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def render_sandboxes(settings: Settings, rows: list[dict[str, Any]], *, now: float) -> None:
    """`dsb --kube sandboxes`: Name, Phase, Provider, Ready, Holder (the Workflow in it), Age."""
    if settings.output != "table":
        emit_data(settings, [{k: v for k, v in row.items() if k != "created"} for row in rows])
        return
    table = Table(title_justify="left")
    for col in ("Name", "Phase", "Provider", "Ready", "Holder", "Age"):
        table.add_column(col, overflow="fold")
    for row in rows:
        ready = row["ready"] + (f" ({row['reason']})" if row["ready"] != "True" and row.get("reason") else "")
        table.add_row(row["name"], styled(row["phase"]), row["provider"], ready, row["holder"] or "-",
                      kube_age(now - row["created"]))
    con = console(wide=settings.wide)
    if rows:
        con.print(table)
    else:
        con.print("no Sandboxes in this namespace")


def state_doc(state: RunState) -> dict[str, Any]:
    """A run's state as -o json/yaml print it: RunState's JSON with RFC 3339 times."""
    doc = state.to_json()
    doc["nextAttempt"] = retry_doc(state_retry(state))
    for key in ("createdAt", "updatedAt", "wakeAt"):
        doc[key] = rfc3339(doc.get(key))
    for op in doc.get("operations", []):
        for key in ("startedAt", "finishedAt"):
            op[key] = rfc3339(op.get(key))
    return doc


def record_doc(row: OperationRecord) -> dict[str, Any]:
    doc = row.to_json()
    doc["ts"] = rfc3339(row.ts)
    return doc


def event_doc(ev: dict[str, Any]) -> dict[str, Any]:
    return {**ev, "ts": rfc3339(ev.get("ts"))} if isinstance(ev.get("ts"), int | float) else ev


def continue_hint(settings: Settings, state: RunState) -> list[str]:
    """What a user types to continue a waiting run (printed on stderr with exit code 3)."""
    dsb = settings.dsb()
    rid = shlex.quote(state.run_id)
    lines: list[str] = []
    if state.pending_callbacks:
        ids = ", ".join(cb.id for cb in state.pending_callbacks)
        lines.append(f"run {state.run_id} is waiting on callback(s): {ids}")
        for cb in state.pending_callbacks:
            if cb.payload is not None:
                lines.append(f"  {cb.id} payload: {compact(cb.payload, 200)}")
        lines.append("continue with:")
        for cb in state.pending_callbacks:
            lines.append(f"  {dsb} signal {rid} {shlex.quote(cb.id)} '<JSON value>'")
        if not settings.kube:  # in a cluster the operator continues a signalled run by itself
            lines.append(f"  {dsb} resume {rid}")
    elif state.wake_at is not None:
        lines.append(f"run {state.run_id} is waiting on a timer until {fmt_time(state.wake_at)}")
        if not settings.kube:
            lines.append(f"continue after that with: {dsb} resume {rid}")
    elif settings.kube:
        lines.append(f"run {state.run_id} is {state.status}; the operator continues it (spec.suspend: false resumes "
                     f"a suspended one)")
    else:
        lines.append(f"run {state.run_id} is {state.status}; continue with: {dsb} resume {rid}")
    return lines


def final_line(state: RunState) -> str:
    if state.status == "succeeded":
        return f"run {state.run_id} succeeded"
    if state.status in ("failed", "cancelled"):
        err = state.error or {}
        return f"run {state.run_id} {state.status}: {err.get('type', '')}: {err.get('message', '')}".rstrip(": ")
    return f"run {state.run_id} is {state.status}"

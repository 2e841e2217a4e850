"""Text from users, providers and tools reaches the terminal verbatim: brackets are never read as markup.

Every table (`inspect`, `history`, `runs`), the outcome line, the progress lines (plain and the live
display on a terminal), `logs`, the continue hints and the errors are rendered with bracketed text in
run ids, workflow and step names, results, tool output, progress messages and error messages.
"""

from __future__ import annotations

import io
import re
import sys
import time

import pytest

from durable_sandbox.cli import render
from durable_sandbox.cli.progress import RichDisplay
from tests.dsb import dsb, lines

FLOW = "tests.unit.cli_flows:brackets"
PROVIDER_ERROR = "Sandbox provider [e2b] needs an API key"
FAILED = f"Step '[fail]' failed after 1 attempt(s): RuntimeError: {PROVIDER_ERROR}"



def rows(table: str) -> list[list[str]]:
    """A table's rows as cell texts, a cell folded over several lines joined again (it folds at spaces)."""
    out: list[list[str]] = []
    for line in lines(table):
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if out and not cells[0]:
            out[-1] = [f"{a} {b}".strip() for a, b in zip(out[-1], cells, strict=True)]
        else:
            out.append(cells)
    return out


def test_failed_run_outcome_tables_and_logs_keep_brackets() -> None:
    run = dsb("run", FLOW, "--input", '{"fail": true}', "--run-id", "[r]1")
    assert run.exit_code == 1, run.output
    out = lines(run.stdout)
    assert out[0] == "run [r]1 ([e2b] brackets)"
    assert f"run [r]1 failed: StepFailed: {FAILED}" in out
    assert any(line.endswith('[[red]step[/red]] "[red]x[/red]"') for line in out), out
    assert any(line.endswith("[bold]half[/bold] :smile: (50%)") for line in out), out

    inspect = dsb("inspect", "[r]1").stdout
    assert "Error: StepFailed: " + FAILED in lines(inspect)
    for text in ("│ [r]1", "│ [e2b] brackets", "[red]step[/red]", '"[red]x[/red]"', "[fail]", "exit 0: [e2b] err"):
        assert text in inspect or text.lstrip("│ ") in inspect, (text, inspect)

    history = dsb("history", "[r]1").stdout
    assert lines(history)[0].startswith("History of [r]1 (")
    cells = rows(history)
    assert ["[red]step[/red]", "step", "<lambda>", "completed", "1", '"[red]x[/red]"'] in [c[2:] for c in cells]
    assert ["[fail]", "step", "_provider_error", "failed", "1", PROVIDER_ERROR] in [c[2:] for c in cells]

    runs = dsb("runs").stdout
    row = next(line for line in lines(runs) if line.startswith("│ [r]1 "))
    assert "│ [e2b] brackets " in row and "failed" in row

    logs = lines(dsb("logs", "[r]1").stdout)
    assert any(line.endswith("[bold]half[/bold] :smile: (50%)") for line in logs), logs
    assert any(line.endswith(f"[[fail]]: {PROVIDER_ERROR}") for line in logs), logs


def test_waiting_run_hints_and_pending_callbacks_keep_brackets() -> None:
    run = dsb("run", FLOW, "--input", '{"wait": true}', "--run-id", "[w]2")
    assert run.exit_code == 3, run.output
    assert "run [w]2 is waiting" in lines(run.stdout)
    assert "run [w]2 is waiting on callback(s): [cb]" in lines(run.stderr)
    assert '  [cb] payload: {"q":"[red]x[/red]"}' in lines(run.stderr)

    inspect = dsb("inspect", "[w]2").stdout
    assert "[cb]" in inspect and '{"q":"[red]x[/red]"}' in inspect and "Pending callbacks" in inspect
    runs = dsb("runs", "--status", "waiting").stdout
    row = next(line for line in lines(runs) if line.startswith("│ [w]2"))
    assert row.rstrip(" │").endswith("[cb]")

    cancelled = dsb("cancel", "[w]2", "--reason", "[yellow]no[/yellow]")
    assert "run [w]2 cancelled: [yellow]no[/yellow]" in lines(cancelled.stdout)
    outcome = dsb("resume", "[w]2")
    assert "run [w]2 cancelled: RunCancelled: [yellow]no[/yellow]" in lines(outcome.stdout)


def test_errors_keep_brackets() -> None:
    missing = dsb("inspect", "[nope]")
    assert missing.exit_code == 2
    assert lines(missing.stderr) == ["error: Run '[nope]' does not exist in this store; list runs with `dsb runs`."]
    manifest = dsb("run", "[x].yaml")
    assert lines(manifest.stderr) == ["error: [x].yaml: no such manifest file"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_display_on_a_terminal_keeps_brackets(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = _Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    display = RichDisplay(render.console(), "[r]1 [bold]title[/bold]")
    display.progress.refresh()
    now = time.time()
    display.event({"type": "progress", "message": "[bold]half[/bold]", "percent": 50, "ts": now})
    display.progress.refresh()
    display.event({"type": "step.completed", "opId": "[o]", "name": "[red]s[/red]", "ts": now, "detail": "[i]x"})
    display.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "[r]1 [bold]title[/bold]" in text
    assert "[bold]half[/bold]" in text
    assert "[red]s[/red] [[o]] [i]x" in text


def test_lifecycle_commands_keep_brackets() -> None:
    dry = dsb("run", "--dry-run", FLOW, "--input", '{"fail": true}', "--run-id", "[d]1")
    assert lines(dry.stdout)[0] == "[e2b] brackets: run [d]1 of workflow [e2b] brackets (new run)"
    assert dsb("run", FLOW, "--input", "{}", "--run-id", "[d]1").exit_code == 0
    waited = dsb("wait", "[d]1")
    assert "run [d]1 succeeded" in lines(waited.stdout) and '"out": "[red]x[/red]"' in waited.stdout
    assert lines(dsb("delete", "[d]1").stdout) == ["run [d]1 deleted"]


@pytest.mark.parametrize(
    ("seconds", "age"),
    [(-3, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (192, "3m12s"), (600, "10m"), (179 * 60 + 59, "179m"),
     (3 * 3600, "3h"), (5 * 3600 + 180, "5h3m"), (30 * 3600, "30h"), (3 * 86400 + 4 * 3600, "3d4h"), (8 * 86400, "8d"),
     (800 * 86400, "2y70d"), (9 * 365 * 86400, "9y")],
)
def test_ages_are_written_as_kubectl_writes_them(seconds: int, age: str) -> None:
    assert render.kube_age(seconds) == age

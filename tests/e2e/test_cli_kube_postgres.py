"""Issue 25: `dsb --kube` (and the web view through it) reads the runs of an operator whose journal is in
PostgreSQL: `--store postgresql://...` names the URL the operator's `--journal` got, and inspect, history and logs
print what they print for the API-server journal. Without it, a run that is in PostgreSQL is not "missing" without
a word: the error says where to look."""

from __future__ import annotations

import json
from typing import Any

from tests.dsb import dsb
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import HELLO, namespace, operators, status, wait_condition
from tests.e2e.postgres_journal_support import ENV, journal_dsn

__all__ = ["journal_dsn", "namespace", "operators"]  # fixtures


def test_dsb_kube_reads_the_runs_of_an_operator_with_a_postgres_journal(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str
) -> None:
    cp, ns = control_plane, namespace
    operators("--allow-local-provider", env={ENV: journal_dsn})
    cp.kubectl("apply", "-n", ns, "-f", str(HELLO))
    wait_condition(cp, ns, "hello", "Succeeded", timeout=120)
    run_id = status(cp, ns, "hello")["runId"]
    env = {"KUBECONFIG": str(cp.kubeconfig)}

    shown = dsb("--kube", "-n", ns, "--store", journal_dsn, "-o", "json", "inspect", "hello", env=env, process=True)
    assert shown.returncode == 0, shown.output
    state = json.loads(shown.stdout)
    assert (state["runId"], state["status"]) == (run_id, "succeeded"), shown.stdout[:2000]
    history = dsb("--kube", "-n", ns, "--store", journal_dsn, "history", "hello", env=env, process=True)
    assert history.returncode == 0 and "write_file: notes/hello.txt" in history.stdout, history.output

    # Without the journal's URL: the run is not in the API server, and the error says what to give.
    missing = dsb("--kube", "-n", ns, "history", "hello", env=env, process=True)
    assert missing.returncode != 0
    assert "the API server" in missing.stderr and "--store postgresql://" in missing.stderr, missing.stderr
    # A local file is no cluster's journal: bad input, one line.
    wrong = dsb("--kube", "-n", ns, "--store", "/tmp/runs.db", "inspect", "hello", env=env, process=True)
    assert wrong.returncode == 2 and "names the operator's PostgreSQL journal" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    # The password is never printed.
    password = journal_dsn.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert password not in shown.output + history.output + missing.output

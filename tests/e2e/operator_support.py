"""The operator as users run it: `dsb operator` as a separate process against the real control plane.

``OperatorProcess`` starts one replica (its own DURABLE_SANDBOX_HOME for the local provider's sandboxes
unless shared), with an optional fault point (engine/faults.py) so a test kills it at an exact place.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from durable_sandbox.engine.records import OperationRecord
from tests.dsb import DSB
from tests.e2e.controlplane import ControlPlane, ReadFailed, fresh_namespace, wait_until
from tests.e2e.journal_support import OperatorJournal, check_rows, kube_journal
from tests.fakes.e2b_state import FakeState
from tests.fakes.fixtures import fake_e2b_in_thread

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
HELLO = ROOT / "examples" / "hello-workflow.yaml"
CRD_NAMES = ["workflows.durable-sandbox.dev", "sandboxes.durable-sandbox.dev", "journals.durable-sandbox.dev",
             "sandboxpools.durable-sandbox.dev", "workflowschedules.durable-sandbox.dev"]


def replica_of(holder: str | None) -> str | None:
    """The ``--worker-id`` a lease holder was started with: its identity is ``<worker-id>:<per-start nonce>``."""
    return holder.rsplit(":", 1)[0] if holder else holder


def leases(cp: ControlPlane, ns: str, selector: str = "") -> list[dict[str, Any]]:
    """The leases of namespace ``ns`` (Journal objects of part ``lease``: runs' and Sandboxes')."""
    label = "durable-sandbox.dev/part=lease" + (f",{selector}" if selector else "")
    items: list[dict[str, Any]] = cp.kubectl_json("get", "journals", "-n", ns, "-l", label)["items"]
    return items


def install_crds(cp: ControlPlane) -> None:
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    wait_established(cp)


def wait_established(cp: ControlPlane, names: Sequence[str] = CRD_NAMES) -> None:
    """Wait until the CRDs ``names`` are Established."""
    # kubectl wait exits 1 at once, instead of waiting, on a CRD whose status the API server has not written
    # yet (".status.conditions accessor error: <nil>"), as right after a first apply: ask again until it waits.
    last: list[subprocess.CompletedProcess[str]] = []

    def established() -> bool:
        last[:] = [cp.kubectl("wait", "--for=condition=Established", *(f"crd/{n}" for n in names),
                              "--timeout=60s", check=False, timeout=90)]
        return last[0].returncode == 0

    try:
        wait_until(established, 120, "the CRDs to be Established")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {last[0].stderr if last else ''}") from None


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    install_crds(control_plane)
    with fresh_namespace(control_plane, "op") as name:
        yield name


@dataclass
class OperatorProcess:
    home: Path
    log_path: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    # Regular expressions of the log lines this replica's test causes on purpose (check_log's ``expected``):
    # the ``operators`` fixture checks every replica's whole log against them when the test ends.
    expected_log: list[str] = field(default_factory=list)

    def start(self, *, fault: str | None = None) -> OperatorProcess:
        env = {**os.environ, "DURABLE_SANDBOX_HOME": str(self.home), "PYTHONUNBUFFERED": "1", **self.env}
        env.pop("DURABLE_SANDBOX_FAULT", None)
        if fault:
            env["DURABLE_SANDBOX_FAULT"] = fault
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [DSB, "operator", *self.args], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
            start_new_session=True,
        )
        log.close()
        return self

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, as a rolling update does; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM if it still runs, SIGKILL if it does not exit within ``timeout``."""
        if self.alive():
            try:
                self.terminate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def expect_log(self, *patterns: str) -> OperatorProcess:
        """Declare log lines (regular expressions) this test causes on purpose, so neither check_log nor the
        ``operators`` fixture's check at the end of the test counts them as problems."""
        self.expected_log.extend(patterns)
        return self

    def log_problems(self, expected: Sequence[str] = ()) -> list[str]:
        return log_problems(self.logs(), [*self.expected_log, *expected])

    def check_log(self, expected: Sequence[str] = ()) -> str:
        """Stop it (SIGTERM, as a rolling update does: its shutdown is logged too), then assert that its whole
        log holds no traceback and no ERROR (issue 24), but for lines matching one of ``expected`` (regular
        expressions: what the test causes on purpose; kept for the fixture's check at the end). Returns the log.
        The ``operators`` fixture does the same for every replica when the test ends; calling it in a test
        checks at that point (e.g. before a second replica starts)."""
        self.stop()
        self.expect_log(*expected)
        text = self.logs()
        problems = self.log_problems()
        assert not problems, log_report(self, problems)
        return text


def log_report(op: OperatorProcess, problems: Sequence[str]) -> str:
    text = op.logs()
    return (f"{op.log_path.name}: {len(problems)} line(s) no passing test leaves (a traceback or an ERROR the test "
            "did not declare with operators(..., expect_log=[...]), op.expect_log(...) or "
            "@pytest.mark.operator_log(...)):\n" + "\n".join(problems[:20]) + f"\n--- the log's end:\n{text[-4000:]}")


# -- the operator's log (issue 24): no traceback and no ERROR that a test did not cause on purpose

_TEXT_LEVEL = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (?P<level>[A-Z]+) ")
TRACEBACK = "Traceback (most recent call last)"


def log_records(text: str) -> list[dict[str, Any]]:
    """The records of an operator's log in either format: {time, level, logger, message, ...} for each JSON
    line; for a text line, level, logger and message parsed from ``<date> <time> <LEVEL> <logger>: <message>``.
    A line that is neither (a traceback's, a CLI ``error:``) is a record of level ``?`` and that line."""
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
                continue
        head = _TEXT_LEVEL.match(line)
        if head is not None:
            logger, _, message = line[head.end():].partition(": ")
            records.append({"level": head["level"], "logger": logger, "message": message, "line": line})
        elif line.strip():
            records.append({"level": "?", "message": line, "line": line})
    return records


def log_problems(text: str, expected: Sequence[str] = ()) -> list[str]:
    """The lines of an operator's log that no passing test leaves (a traceback, a record at ERROR or above, the
    CLI's ``error:`` at exit) and that match none of ``expected``."""
    problems = []
    for record in log_records(text):
        line = record.get("line") or json.dumps(record)
        bad = (record.get("level") in ("ERROR", "CRITICAL") or TRACEBACK in line or TRACEBACK in str(
            record.get("exception") or "") or str(record.get("message", "")).startswith("error:"))
        if bad and not any(re.search(pattern, line) for pattern in expected):
            problems.append(line)
    return problems


def lifecycle(text: str, ns: str, name: str) -> list[str]:
    """The lifecycle lines of Workflow ``ns/name`` (logger durable_sandbox.kube.lifecycle): their messages
    without the ``<ns>/<name> (run <id>): `` prefix."""
    prefix = re.compile(rf"^{re.escape(ns)}/{re.escape(name)} \(run [^)]*\): ")
    return [prefix.sub("", r["message"]) for r in log_records(text)
            if r.get("logger") == "durable_sandbox.kube.lifecycle" and prefix.match(str(r.get("message", "")))]


def declared_log_lines(request: pytest.FixtureRequest) -> list[str]:
    """The patterns of ``@pytest.mark.operator_log(pattern, ..., why=...)`` on the test (or its module): log lines
    every replica of the test may hold because the test causes them on purpose. ``why`` is required: a
    declaration says why the line is expected, or it is a bug hidden."""
    patterns: list[str] = []
    for mark in request.node.iter_markers("operator_log"):
        if not str(mark.kwargs.get("why") or "").strip():
            raise pytest.UsageError(f"{request.node.nodeid}: @pytest.mark.operator_log needs why=... (what causes "
                                    f"the lines {mark.args} on purpose)")
        patterns.extend(mark.args)
    return patterns


@pytest.fixture
def operators(request: pytest.FixtureRequest, tmp_path: Path, namespace: str,
              operator_journal: OperatorJournal) -> Iterator[Any]:
    """A factory of operator replicas serving the test's namespace (other tests' Workflows are not theirs),
    each with the test's journal (``operator_journal``: the API server's, or PostgreSQL under the switch of
    tests/e2e/journal_support.py; a test's own ``env`` wins); every one still running is stopped at the end, and
    then every replica's whole log is checked (issue 24): a traceback or an ERROR line fails the test unless it
    was declared (``expect_log=[...]`` here, ``op.expect_log(...)``, ``op.check_log(expected)`` or the test's
    ``@pytest.mark.operator_log(..., why=...)``)."""
    started: list[OperatorProcess] = []
    declared = declared_log_lines(request)

    def make(*args: str, home: Path | None = None, env: dict[str, str] | None = None,
             fault: str | None = None, name: str | None = None, expect_log: Sequence[str] = ()) -> OperatorProcess:
        name = name or f"operator-{len(started) + 1}"
        op = OperatorProcess(
            home=home or tmp_path / "home", log_path=tmp_path / f"{name}.log",
            args=["--lease-seconds", "6", "--worker-id", name, "--namespace", namespace, *args],
            env={**operator_journal.env, **(env or {})}, expected_log=[*declared, *expect_log],
        )
        op.home.mkdir(parents=True, exist_ok=True)
        started.append(op)
        return op.start(fault=fault)

    try:
        yield make
    finally:
        for op in started:
            op.stop()
        for op in started:
            if op.process is not None and op.process.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM):
                print(f"--- {op.log_path.name} (exit {op.process.returncode})\n{op.logs()[-6000:]}", file=sys.stderr)
    reports = [log_report(op, problems) for op in started if (problems := op.log_problems())]
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)


def effect_calls(effects: Path, n: int, *, gate: Path | None = None, gate_at: int = -1) -> list[dict[str, Any]]:
    calls = []
    for i in range(1, n + 1):
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done; " if gate is not None and i == gate_at else ""
        calls.append({"type": "shell", "operationId": f"c{i}", "command": f"{wait}echo c{i} >> {effects}; echo c{i}"})
    return calls


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(HELLO.read_text())
    doc["metadata"]["name"] = name
    for key, value in spec.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return doc


def get(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    with contextlib.suppress(ReadFailed):
        return cp.read(f"/apis/durable-sandbox.dev/v1alpha1/namespaces/{ns}/workflows/{name}")
    proc = cp.kubectl("get", "workflow", name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


def status(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    obj = get(cp, ns, name) or {}
    st: dict[str, Any] = obj.get("status") or {}
    return st


def condition(cp: ControlPlane, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    for cond in status(cp, ns, name).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def wait_in_flight(cp: ControlPlane, ns: str, name: str, index: int, timeout: float = 90) -> None:
    """Wait until status says call ``index`` (0-based) is the one in flight."""
    try:
        wait_until(lambda: (status(cp, ns, name).get("currentCall") or {}).get("index") == index, timeout,
                   f"call {index} of {ns}/{name} to be in flight")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status: {json.dumps(status(cp, ns, name))[:3000]}") from None


def wait_condition(cp: ControlPlane, ns: str, name: str, ctype: str, timeout: float = 120) -> None:
    """`kubectl wait --for=condition=...`: what users run."""
    proc = cp.kubectl("wait", f"--for=condition={ctype}", f"workflow/{name}", "-n", ns, f"--timeout={int(timeout)}s",
                      check=False, timeout=timeout + 30)
    if proc.returncode != 0:
        raise AssertionError(
            f"workflow {ns}/{name} never got condition {ctype}: {proc.stderr}\nstatus: {json.dumps(status(cp, ns, name))[:3000]}"
        )


def events(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    try:
        out = cp.read(f"/api/v1/namespaces/{ns}/events", fieldSelector=f"involvedObject.name={name}") or {}
    except ReadFailed:
        out = cp.kubectl_json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    items: list[dict[str, Any]] = out.get("items", [])
    return items


def event_time(event: dict[str, Any]) -> str:
    """When an Event happened: the operator's carry an eventTime (microseconds), others' a lastTimestamp."""
    return str(event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp") or "")


def event_reasons(cp: ControlPlane, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in sorted(events(cp, ns, name), key=event_time)]


def wait_event(cp: ControlPlane, ns: str, name: str, reason: str, timeout: float = 60) -> None:
    wait_until(lambda: reason in event_reasons(cp, ns, name), timeout, f"event {reason} on {ns}/{name}")


def wait_gone(cp: ControlPlane, ns: str, name: str, timeout: float = 120) -> None:
    wait_until(lambda: get(cp, ns, name) is None, timeout, f"workflow {ns}/{name} to disappear")


def local_sandboxes(home: Path) -> list[str]:
    """The local provider's inventory: live workspaces and snapshots under DURABLE_SANDBOX_HOME."""
    found = []
    for sub in ("local/workspaces", "local/snapshots"):
        d = home / sub
        if d.is_dir():
            found.extend(f"{sub}/{p.name}" for p in d.iterdir() if not p.name.startswith("."))
    return sorted(found)


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds


# -- the operator's /metrics and /healthz (`dsb operator --metrics-port`, the chart's metrics.port)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of a GET on 127.0.0.1:port; (0, "") while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def scrape(port: int) -> Samples:
    """/metrics parsed with prometheus-client's parser: value by (sample name, labels)."""
    code, text = http_get(port, "/metrics")
    assert code == 200, text
    return parse_samples(text)


def parse_samples(text: str) -> Samples:
    """A Prometheus text exposition: value by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(got: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in got.items() if n == name and want <= ls)


# -- the fake E2B server, for operators that use the e2b provider


@pytest.fixture
def fake_e2b(tmp_path: Path) -> Iterator[FakeState]:
    """The fake E2B server on its own event loop thread (the test itself blocks on kubectl)."""
    with fake_e2b_in_thread(tmp_path / "fake-e2b") as (state, _):
        yield state


# -- a run's journal in the API server (the chart's tests; the harness's operators: OperatorJournal)


def journal(cp: ControlPlane, ns: str, run_id: str) -> list[OperationRecord]:
    return kube_journal(cp, ns, run_id)


def check_journal(cp: ControlPlane, ns: str, run_id: str) -> None:
    """No gap and no duplicate in the journal, and no operation completed twice."""
    check_rows(journal(cp, ns, run_id))


def sa_kubeconfig(cp: ControlPlane, namespace: str, sa: str, path: Path) -> None:
    """A kubeconfig holding a TokenRequest token of ``sa`` (what the kubelet mounts into a Pod)."""
    token = cp.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cp.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data") or base64.b64encode(
        Path(cluster["certificate-authority"]).read_bytes()
    ).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "cp", "cluster": {"server": cp.server, "certificate-authority-data": ca}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "cp", "user": sa, "namespace": namespace}}],
    }))

"""scripts/dev-cluster's settings and its wait for readiness (issue 33, item 6), without a cluster: the script runs
in a project of its own whose controlplane binary is a stand-in that records its arguments, "waits for another
node" as long as told, takes the node lock (a file of the test's: the script's copy points there) and reports
ready, or never does. The real binary is the e2e tier's (tests/e2e/test_dev_cluster.py)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dsb import ROOT

SCRIPT = ROOT / "scripts" / "dev-cluster"
LOCK_LINE = re.compile(r"^node_lock=(\S+)$", re.MULTILINE)
DEADLINE = 120.0  # generous bound on one invocation; the script's own timeouts here are 1-3 s

FAKE_UP = r"""#!/usr/bin/env bash
# Stands in for `controlplane up` (and `node-clean`, which `down` may call).
case "$1" in node-clean) exit 0 ;; esac
printf '%s\n' "$@" >"$FAKE_DIR/args"
ready="" node=""
while (($#)); do
  case "$1" in --ready-file) ready=$2; shift ;; --node) node=$2; shift ;; esac
  shift
done
trap 'exit 0' TERM
if [[ -n "$node" ]]; then
  sleep "${FAKE_LOCK_WAIT:-0}"  # another node holds the lock this long (the time it takes is the point)
  echo "$$" >"$FAKE_DIR/node.lock"
fi
[[ -n "${FAKE_NEVER_READY:-}" ]] || echo '{}' >"$ready"
while :; do sleep 0.1; done  # serves until `down`
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project directory holding a copy of the script (its node lock in the test's directory) and stand-ins for
    the scripts it calls; `down` is run at the end, so no stand-in outlives the test."""
    proj = tmp_path / "proj"
    scripts = proj / "scripts"
    scripts.mkdir(parents=True)
    fake = tmp_path / "fake"
    fake.mkdir()
    text, n = LOCK_LINE.subn(f"node_lock={fake / 'node.lock'}", SCRIPT.read_text())
    assert n == 1, "the script names its node lock on one line"
    _executable(scripts / "dev-cluster", text)
    _executable(fake / "up", FAKE_UP)
    _executable(scripts / "controlplane-build", f"#!/bin/sh\ntouch {fake / 'built'}\necho {fake / 'up'}\n")
    _executable(scripts / "node-prepare", f"#!/bin/sh\necho {fake / 'pause.tar'}\n")
    _executable(scripts / "gvisor-build", "#!/bin/sh\nexit 1\n")
    yield proj
    run(proj, "down")


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def run(proj: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    fake = proj.parent / "fake"
    environ = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(proj.parent), "FAKE_DIR": str(fake),
               "DEV_CLUSTER_DIR": str(proj / ".dev-cluster"), **env}
    return subprocess.run([str(proj / "scripts" / "dev-cluster"), *args], capture_output=True, text=True,
                          env=environ, timeout=DEADLINE, stdin=subprocess.DEVNULL, check=False)


def up_args(proj: Path) -> list[str]:
    return (proj.parent / "fake" / "args").read_text().splitlines()


@pytest.mark.parametrize(("given", "passed"), [("1800", "1800s"), ("0090", "90s"), ("30m", "30m"), ("1h30m", "1h30m"),
                                                ("2.5s", "2.5s")])
def test_the_node_lock_timeout_takes_plain_seconds_and_go_durations(project: Path, given: str, passed: str) -> None:
    up = run(project, "up", DEV_CLUSTER_NODE_LOCK_TIMEOUT=given)
    assert up.returncode == 0, up.stderr
    args = up_args(project)
    assert args[args.index("--node-lock-timeout") + 1] == passed


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("DEV_CLUSTER_NODE_LOCK_TIMEOUT", "soon",
     "DEV_CLUSTER_NODE_LOCK_TIMEOUT=soon is not a duration: give seconds (1800) or a Go duration (30m, 1h30m)"),
    ("DEV_CLUSTER_NODE_LOCK_TIMEOUT", "30 min",
     "DEV_CLUSTER_NODE_LOCK_TIMEOUT=30 min is not a duration: give seconds (1800) or a Go duration (30m, 1h30m)"),
    ("DEV_CLUSTER_READY_TIMEOUT", "5m",
     "DEV_CLUSTER_READY_TIMEOUT=5m is not a number of seconds: give a whole number such as 300"),
    ("DEV_CLUSTER_READY_TIMEOUT", "0",
     "DEV_CLUSTER_READY_TIMEOUT=0 is not a number of seconds: give a whole number such as 300"),
])
def test_a_wrong_timeout_is_one_line_naming_the_variable_before_anything_starts(
    project: Path, variable: str, value: str, message: str
) -> None:
    up = run(project, "up", **{variable: value})
    assert up.returncode == 2
    assert up.stderr.splitlines() == [f"dev-cluster: {message}"]
    assert not (project.parent / "fake" / "built").exists(), "nothing was built or started"


def test_the_ready_timeout_starts_once_the_node_lock_is_taken(project: Path) -> None:
    """Another node holds the lock for 3 s and the ready timeout is 1 s: the wait for the lock does not count."""
    up = run(project, "up", DEV_CLUSTER_READY_TIMEOUT="1", DEV_CLUSTER_NODE_LOCK_TIMEOUT="60", FAKE_LOCK_WAIT="3")
    assert up.returncode == 0, up.stderr
    assert "dev-cluster: ready (pid" in up.stderr


def test_a_cluster_that_never_gets_ready_still_fails_at_the_ready_timeout(project: Path) -> None:
    up = run(project, "up", DEV_CLUSTER_READY_TIMEOUT="1", FAKE_NEVER_READY="1")
    assert up.returncode == 1
    assert "dev-cluster: not ready after 1s; stopping it" in up.stderr
    assert run(project, "status").returncode == 1, "stopped"


def test_without_a_node_the_ready_timeout_counts_from_the_start(project: Path) -> None:
    up = run(project, "up", "--no-node", DEV_CLUSTER_READY_TIMEOUT="1", FAKE_NEVER_READY="1")
    assert up.returncode == 1
    assert "dev-cluster: not ready after 1s; stopping it" in up.stderr
    assert "--node" not in up_args(project)


def test_the_scripts_node_lock_is_the_one_up_takes() -> None:
    go = (ROOT / "tests" / "controlplane" / "node.go").read_text()
    declared = re.search(r'nodeLockPath\s*=\s*"([^"]+)"', go)
    script = LOCK_LINE.search(SCRIPT.read_text())
    assert declared is not None and script is not None
    assert script.group(1) == declared.group(1)


"""scripts/controlplane-build tells a waiting user that a long build is still going (the first
`scripts/test` builds Kubernetes for minutes), and still answers with the binary's path alone on stdout."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for the Go toolchain: `go build` finishes only once the test has seen a heartbeat.
FAKE_GO = """#!/usr/bin/env bash
case "$1" in
  version) echo "go version go1.99 linux/amd64" ;;
  build)
    while [[ ! -e "$RELEASE" ]]; do sleep 0.05; done
    out=""; prev=""
    for arg in "$@"; do [[ "$prev" == "-o" ]] && out="$arg"; prev="$arg"; done
    printf '#!/bin/sh\\n' > "$out" && chmod +x "$out" ;;
  *) exit 2 ;;
esac
"""


def test_a_long_build_reports_progress_and_stdout_stays_the_path(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    release = tmp_path / "release"
    env = {**os.environ, "GO": str(go), "RELEASE": str(release), "CONTROLPLANE_SKIP_HELM": "1",
           "CONTROLPLANE_HEARTBEAT_SECONDS": "0.2", "DURABLE_SANDBOX_CONTROLPLANE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([str(ROOT / "scripts" / "controlplane-build")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    try:
        while not any("still building" in line for line in seen) and time.monotonic() < deadline:
            if selector.select(timeout=max(deadline - time.monotonic(), 0)):
                line = proc.stderr.readline()
                if not line:
                    break
                seen.append(line)
    finally:
        release.touch()  # let the build finish either way
        out, rest = proc.communicate(timeout=60)
    assert any("still building" in line and "s so far" in line for line in seen), seen
    assert proc.returncode == 0, rest
    binary = Path(out.strip())
    assert out.count("\n") == 1 and binary.name == "controlplane" and os.access(binary, os.X_OK)

"""A real S3-compatible object store for the tests: versitygw on loopback (scripts/s3-server installs it).

``s3_server`` (a session fixture in tests/conftest.py) starts one per test session on a free port over a data
directory under pytest's temp root (ext4 here: versitygw keeps metadata in user xattrs), with credentials made
for the session. Tests get a bucket of their own from :meth:`S3Server.config` and can stop and start the server
(the store "down" and back) without losing its data.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from durable_sandbox.providers.s3_snapshots import S3Config
from tests.ports import free_port
from tests.processes import stop_process

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = PROJECT_ROOT / "scripts" / "s3-server"
READY_TIMEOUT_S = 30.0
INSTALL_TIMEOUT_S = 30 * 60


def install_versitygw() -> Path:
    """scripts/s3-server install: the cached binary's path (installs it the first time, under a lock)."""
    proc = subprocess.run([str(SCRIPT), "install"], stdout=subprocess.PIPE, text=True, timeout=INSTALL_TIMEOUT_S,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/s3-server install failed with exit code {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: a killed pytest takes the store with it


@dataclass
class S3Server:
    binary: Path
    data: Path
    log: Path
    port: int = field(default_factory=free_port)
    # Loopback, except where Pods must be able to reach it (the egress tests listen on the node's address).
    host: str = "127.0.0.1"
    access_key: str = field(default_factory=lambda: "dsbtest" + secrets.token_hex(4))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(20), repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def config(self, bucket: str, **overrides: object) -> S3Config:
        fields: dict[str, object] = {"bucket": bucket, "access_key_id": self.access_key,
                                     "secret_access_key": self.secret_key, "endpoint": self.endpoint}
        fields.update(overrides)
        return S3Config(**fields)  # type: ignore[arg-type]

    def environ(self, bucket: str, prefix: str = "") -> dict[str, str]:
        """The operator's environment for this store (what the chart sets from its values and Secret)."""
        return {"DSB_S3_ENDPOINT": self.endpoint, "DSB_S3_BUCKET": bucket, "DSB_S3_PREFIX": prefix,
                "DSB_S3_ACCESS_KEY_ID": self.access_key, "DSB_S3_SECRET_ACCESS_KEY": self.secret_key}

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.data.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ROOT_ACCESS_KEY": self.access_key, "ROOT_SECRET_KEY": self.secret_key}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "--port", f"{self.host}:{self.port}", "--region", "us-east-1", "--quiet",
                 "posix", str(self.data)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"versitygw exited with {self.process.returncode}; see {self.log}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"versitygw is not listening on {self.endpoint} after {READY_TIMEOUT_S:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (the store is then down: connections are refused); its data stays for :meth:`start`."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, timeout=10)

    def buckets(self) -> list[str]:
        return sorted(p.name for p in self.data.iterdir() if p.is_dir() and not p.name.startswith("."))

    def objects(self, bucket: str) -> list[str]:
        """Every object key in ``bucket`` read from the data directory (what a leak check compares)."""
        root = self.data / bucket
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))

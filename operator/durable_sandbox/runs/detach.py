"""`dsb run --detach`: the runs are created here, then driven by a `dsb run` in a background process.

The background process runs the same target with the same run ids, so everything `dsb run` does for a
run (retries, timeouts, the sandbox cleanup when it ends) happens there too; its stdout (the final JSON
document) is dropped and its stderr appended to ``<store>.detached.log`` next to the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from durable_sandbox.runs.settings import STORE_ENV, Settings


def log_path(settings: Settings) -> Path:
    return Path(f"{settings.store_path}.detached.log")


def background(settings: Settings, argv: list[str]) -> subprocess.Popen[bytes]:
    """``argv`` in a process (and session) of its own, with the store in its environment and its stderr
    appended to the detach log; closing the terminal (SIGHUP) or Ctrl-C in it does not stop it."""
    # The store goes in the environment, not the command line: a URL's password must not show in `ps`.
    env = {**os.environ, STORE_ENV: settings.location}
    path = log_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Owner-only, as the store beside it is: a run's errors name its operations and inputs.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)  # a log an older version made 0644 is narrowed too
    with os.fdopen(fd, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, env=env)


def spawn(settings: Settings, target: str, *, run_id: str | None, thread_id: str | None,
          input_value: Any = None, has_input: bool = False) -> int:
    """Start the background `dsb run`; returns its process id."""
    argv = [sys.executable, "-m", "durable_sandbox.cli.main", "-o", "json", "run", target]
    if run_id is not None:
        argv += ["--run-id", run_id]
    if thread_id is not None:
        argv += ["--thread-id", thread_id]
    if has_input:
        argv += ["--input", json.dumps(input_value)]
    return background(settings, argv).pid

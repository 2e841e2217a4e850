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

from durable_sandbox.cli.settings import STORE_ENV, Settings


def log_path(settings: Settings) -> Path:
    return Path(f"{settings.store_path}.detached.log")


def spawn(settings: Settings, target: str, *, run_id: str | None, thread_id: str | None,
          input_value: Any = None, has_input: bool = False) -> int:
    """Start the background `dsb run`; returns its process id."""
    # The store goes in the environment, not the command line: a URL's password must not show in `ps`.
    argv = [sys.executable, "-m", "durable_sandbox.cli.main", "-o", "json", "run", target]
    env = {**os.environ, STORE_ENV: settings.location}
    if run_id is not None:
        argv += ["--run-id", run_id]
    if thread_id is not None:
        argv += ["--thread-id", thread_id]
    if has_input:
        argv += ["--input", json.dumps(input_value)]
    log_path(settings).parent.mkdir(parents=True, exist_ok=True)
    with log_path(settings).open("ab") as log:
        # A session of its own: closing the terminal (SIGHUP) or Ctrl-C in it does not stop the run.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, env=env)
    return proc.pid

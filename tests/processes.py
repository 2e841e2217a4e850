"""Stopping a helper process the tests started (an S3 server, a NetworkPolicy enforcer)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; reaped either way."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)

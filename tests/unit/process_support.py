"""Finding the processes of a tool call (by a token in their environment) and waiting on conditions."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def pids_with_env(token: str) -> list[int]:
    """Live processes whose environment holds ``token`` (children inherit it, so: every process of a call)."""
    needle = token.encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes():
                stat = (environ.parent / "stat").read_bytes()
                if stat[stat.rfind(b")") + 2 :].split()[0] != b"Z":
                    found.append(int(environ.parent.name))
        except OSError:
            continue  # exited while we looked, or not ours
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


async def eventually(condition: Callable[[], T], what: str, deadline: float = 20.0) -> T:
    """Poll ``condition`` until it is truthy; a condition with a deadline, never a fixed sleep."""
    give_up = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > give_up:
            raise TimeoutError(f"timed out after {deadline:g}s waiting for {what}")
        await asyncio.sleep(0.02)

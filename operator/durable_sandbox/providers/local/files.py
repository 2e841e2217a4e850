"""``write_file`` and ``read_file`` in a workspace: regular files only (never a FIFO, device or last-moment
symlink), reads bounded to the first and last 64 KiB."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from durable_sandbox.providers.contract import (
    SandboxGone,
    ToolResult,
    file_not_found_result,
    wrote_file_result,
)
from durable_sandbox.providers.local.arguments import Refused, resolve_inside
from durable_sandbox.providers.output import OutputBuffer

# Opening never blocks (a FIFO without a writer would block forever) and never follows a last-moment
# symlink; what was opened is then checked to be a regular file before a byte is read or written.
_OPEN_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def _not_regular(path: str, mode: int, verb: str) -> Refused:
    if stat.S_ISDIR(mode):
        return Refused(f"Cannot {verb[:-2] if verb == 'written' else verb} {path}: Is a directory")
    kind = (
        "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
        else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"
    )
    return Refused(f"Cannot {'write' if verb == 'written' else verb} {path}: it is {kind}, not a regular file; "
                    f"only regular files can be {verb}")


def write_file(sandbox_id: str, workspace: Path, path: str, contents: str) -> ToolResult:
    target = resolve_inside(workspace, path)
    data = contents.encode("utf-8")
    # Without this check, creating parent directories would resurrect a destroyed workspace.
    if not workspace.is_dir():
        raise SandboxGone(sandbox_id, "its workspace is missing")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(target).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # before opening: never O_TRUNC a FIFO or device
                raise _not_regular(path, mode, "written")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS, 0o666)
        with os.fdopen(fd, "wb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(path, mode, "written")
            f.write(data)
    except OSError as e:
        raise Refused(f"Cannot write {path}: {e.strerror or e}") from e
    return wrote_file_result(path, len(data))


def read_file(sandbox_id: str, workspace: Path, path: str) -> ToolResult:
    target = resolve_inside(workspace, path)
    try:
        fd = os.open(target, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        if not workspace.is_dir():
            raise SandboxGone(sandbox_id, "its workspace is missing") from None
        return file_not_found_result(path)
    except OSError as e:
        raise Refused(f"Cannot read {path}: {e.strerror or e}") from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_regular(path, info.st_mode, "read")
    with os.fdopen(fd, "rb") as f:
        # Streaming and bounded: the first and last 64 KiB of a big file, never all of it in memory.
        buffer = OutputBuffer()
        try:
            buffer.feed(f.read(buffer.keep))
            rest = info.st_size - f.tell()
            if rest > buffer.keep:
                buffer.skip(rest - buffer.keep)
                f.seek(-buffer.keep, os.SEEK_END)
            while chunk := f.read(1 << 16):
                buffer.feed(chunk)
        except OSError as e:
            raise Refused(f"Cannot read {path}: {e.strerror or e}") from e
    return ToolResult(exit_code=0, stdout=buffer.text(), stderr="", stdout_size=buffer.full_size)

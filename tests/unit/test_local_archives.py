"""The local provider's snapshot archive (providers/local/archives.py) while the sandbox's own processes change the
workspace under it: an entry removed after it was listed, a file swapped for a FIFO after it was looked at, a file
truncated while it is read. Each change is made at the exact point it matters (a wrapped ``os`` call), not by
racing a writer; none fails the snapshot, and none blocks it."""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.providers.archive_limit import ArchiveBudget
from durable_sandbox.providers.local import archives


def _budget() -> ArchiveBudget:
    return ArchiveBudget(1 << 30, "snapshot of test", "limit")


def _members(tar_path: Path) -> dict[str, bytes | None]:
    with tarfile.open(tar_path) as tar:
        out: dict[str, bytes | None] = {}
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isreg() else None
            out[m.name] = f.read() if f is not None else None
        return out


def _wrapped(monkeypatch: pytest.MonkeyPatch, name: str, after: Callable[[Any, Any], None]) -> None:
    """``os.<name>`` calls ``after(path, answer)`` once it answered (for the test's one change, at that point)."""
    real = getattr(os, name)

    def call(path: Any, *args: Any, **kwargs: Any) -> Any:
        answer = real(path, *args, **kwargs)
        after(path, answer)
        return answer

    monkeypatch.setattr(os, name, call)


def test_an_entry_removed_after_it_was_listed_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "keep.txt").write_text("kept")
    (ws / "sub" / "tmp.o").write_text("gone soon")

    def remove(path: Any, names: Any) -> None:
        if Path(path) == ws / "sub":
            (ws / "sub" / "tmp.o").unlink()  # a build's temp file, removed between the listing and the read

    _wrapped(monkeypatch, "listdir", remove)
    archives.write_tar(ws, tmp_path / "snap.tar", _budget())
    monkeypatch.undo()
    assert _members(tmp_path / "snap.tar") == {"keep.txt": b"kept", "sub": None}


def test_a_file_swapped_for_a_fifo_is_never_opened_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    (ws / "trap").write_text("a regular file when looked at")

    def swap(path: Any, answer: Any) -> None:
        if Path(path) == ws / "trap" and (ws / "trap").is_file():
            (ws / "trap").unlink()
            os.mkfifo(ws / "trap")  # no writer: a blocking open would wait for ever

    _wrapped(monkeypatch, "lstat", swap)
    done = threading.Event()
    failed: list[BaseException] = []

    def write() -> None:
        try:
            archives.write_tar(ws, tmp_path / "snap.tar", _budget())
        except BaseException as exc:
            failed.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=write, daemon=True)
    worker.start()
    finished = done.wait(timeout=20)
    monkeypatch.undo()
    if not finished:  # let the blocked open go (a writer appears), so that the thread ends
        fd = os.open(ws / "trap", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert finished, "the snapshot blocked on a FIFO swapped in for a file"
    assert not failed, failed
    assert _members(tmp_path / "snap.tar") == {"a.txt": b"a"}


def test_a_file_truncated_while_it_is_read_is_archived_at_its_size_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "log").write_bytes(b"x" * 10_000)
    real_fstat = os.fstat

    def fstat_then_truncate(fd: int) -> os.stat_result:
        answer = real_fstat(fd)
        if answer.st_size == 10_000:
            os.truncate(ws / "log", 100)  # the sandbox's process truncates it once its size was taken
        return answer

    monkeypatch.setattr(os, "fstat", fstat_then_truncate)
    archives.write_tar(ws, tmp_path / "snap.tar", _budget())
    monkeypatch.undo()
    assert _members(tmp_path / "snap.tar") == {"log": b"x" * 100 + bytes(9_900)}


def test_hard_links_and_symlinks_are_still_archived(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "one").write_text("shared")
    os.link(ws / "one", ws / "two")
    os.symlink("one", ws / "link")
    archives.write_tar(ws, tmp_path / "snap.tar", _budget())
    out = tmp_path / "out"
    archives.extract_tar(tmp_path / "snap.tar", out)
    assert [(out / n).read_text() for n in ("one", "two", "link")] == ["shared"] * 3
    assert os.readlink(out / "link") == "one" and (out / "one").stat().st_ino == (out / "two").stat().st_ino

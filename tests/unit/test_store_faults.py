"""Store faults are loud and named: a store deleted under a running process, a full disk (and recovery
once space is freed), a damaged cell, a read-only, non-SQLite or device `--store`. Real SQLite files, a
real tmpfs of 1 MiB for the full disk (root only: mounting needs it), the real `dsb` console script.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_sandbox.engine import Engine, StoreError, workflow
from durable_sandbox.stores import SqliteStore
from tests.dsb import dsb


def _remove_store_dir(directory: str) -> str:
    shutil.rmtree(directory)
    return "gone"


@workflow(name="test-store-deleted")
async def deletes_its_store(ctx, directory: str) -> str:
    await ctx.step("one", lambda: 1)
    await ctx.step("remove", _remove_store_dir, directory)
    await ctx.step("two", lambda: 2)
    return "finished on a store nobody can read"


async def test_a_store_deleted_under_a_running_process_fails_loudly(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    store = SqliteStore(directory / "runs.db")
    try:
        with pytest.raises(StoreError, match="was deleted or replaced while this process was using it"):
            await Engine(store).run(deletes_its_store, str(directory), run_id="orphaned")
    finally:
        await store.close()


async def test_a_store_replaced_by_another_file_fails_loudly(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store)
    await engine.run(workflow(name="test-store-replaced")(_one_step), None, run_id="before")
    os.replace(SqliteStore(tmp_path / "other.db").path, tmp_path / "runs.db")
    try:
        with pytest.raises(StoreError, match=f"{tmp_path / 'runs.db'} was deleted or replaced"):
            await engine.run("test-store-replaced", None, run_id="after")
    finally:
        await store.close()


async def _one_step(ctx, _: None) -> int:
    return await ctx.step("one", lambda: 1)


async def test_one_damaged_cell_does_not_hide_every_run(tmp_path: Path, home: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    engine = Engine(store)
    wf = workflow(name="test-store-damaged")(_one_step)
    for run_id in ("good", "damaged"):
        await engine.run(wf, None, run_id=run_id)
    await store.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET labels='{not json', result='[1,' WHERE run_id='damaged'")
    con.commit()
    con.close()

    listed = dsb("--store", str(db), "runs", process=True)
    assert listed.returncode == 0, listed.stderr
    assert "good" in listed.stdout and "damaged" in listed.stdout
    shown = dsb("--store", str(db), "-o", "json", "inspect", "damaged", process=True)
    assert shown.returncode == 0, shown.stderr
    assert "damaged column(s) labels, result" in shown.stdout and str(db) in shown.stdout


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: Path("/dev/null"), "it is not a regular file"),
    (lambda p: (p / "notes.txt", (p / "notes.txt").write_text("these are my notes\n"))[0], "it is not a SQLite database"),
])
def test_a_store_path_that_is_no_store_is_refused_naming_it(tmp_path: Path, home: Path, make, says) -> None:
    path = make(tmp_path)
    before = sorted(os.listdir(path.parent))
    result = dsb("--store", str(path), "runs", process=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: Cannot use {path} as a store: {says}"), result.stderr
    assert sorted(os.listdir(path.parent)) == before, "nothing created beside it (no /dev/null-journal)"


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_read_only_store_is_refused_naming_it(tmp_path: Path, home: Path) -> None:
    with tmpfs(tmp_path / "ro", "4m") as mnt:
        db = mnt / "runs.db"
        assert dsb("--store", str(db), "run", "tests.unit.cli_flows:doubler", "--input",
                   '{"x": 1}', process=True).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        result = dsb("--store", str(db), "run", "tests.unit.cli_flows:doubler", "--input", '{"x": 2}', process=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: Cannot open the store {db}: it is read-only" in result.stderr, result.stderr


def test_a_full_disk_fails_the_run_clearly_and_it_finishes_once_space_is_freed(tmp_path: Path,
                                                                               home: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as mnt:
        filler = mnt / "filler"
        filler.write_bytes(b"0" * 600_000)
        db = mnt / "runs.db"
        args = ("--store", str(db), "run", "tests.unit.cli_flows:big_steps", "--input", '{"n": 12, "size": 40000}',
                "--run-id", "full")
        first = dsb(*args, process=True)
        assert first.returncode == 1, first.stdout + first.stderr
        assert f"Store {db}: the disk is full" in first.stdout + first.stderr
        filler.unlink()
        resumed = dsb("--store", str(db), "resume", "full", process=True)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert '"steps": 12' in resumed.stdout


def test_a_directory_is_no_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"Cannot use {tmp_path} as a store: it is a directory; give a store file's path"):
        SqliteStore(tmp_path)

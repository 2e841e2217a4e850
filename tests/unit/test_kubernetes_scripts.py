"""The kubernetes provider's in-Pod scripts, run by this machine's POSIX sh exactly as an exec runs them
(``sh -c BOOT dsb N`` with the script, then the data, on stdin), in a temp directory standing in for the
workspace: confinement, result codes, tagging and the kill of a call's processes."""

from __future__ import annotations

import os
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.kubernetes_calls import read_result
from durable_sandbox.providers.output import OutputBuffer


def run(script: bytes, data: bytes = b"", timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(scripts.boot_command(script), input=script + data, capture_output=True, timeout=timeout,
                          check=False)


def _applets(tmp_path: Path) -> Path:
    """A PATH of busybox's applets only (what a busybox sandbox image has)."""
    applets = tmp_path / "busybox-bin"
    applets.mkdir()
    for name in ("sh", "dd", "head", "cat", "tr", "mkdir", "mv", "rm", "readlink", "pwd", "ls", "wc"):
        os.symlink(BUSYBOX, applets / name)
    return applets


def _run_in(applets: Path | None, script: bytes) -> subprocess.CompletedProcess[bytes]:
    if applets is None:
        return run(script)
    return subprocess.run([str(applets / "sh"), *scripts.boot_command(script)[1:]], input=script, capture_output=True,
                          timeout=30, check=False, env={"PATH": str(applets)})


BUSYBOX = Path("/bin/busybox")


@pytest.mark.skipif(not BUSYBOX.exists(), reason="needs /bin/busybox (scripts/node-prepare installs busybox-static)")
def test_the_data_after_the_script_reaches_it_under_busybox(ws: Path, tmp_path: Path) -> None:
    """busybox's head -c reads a whole buffer from a pipe: the boot must not take any of the data."""
    applets = tmp_path / "bin"
    applets.mkdir()
    for name in ("sh", "dd", "head", "cat", "tr", "mkdir", "mv", "rm", "readlink", "pwd"):
        os.symlink(BUSYBOX, applets / name)
    script = scripts.write_file("a.txt", 5, workspace=str(ws))
    command = [str(applets / "sh"), *scripts.boot_command(script)[1:]]
    out = subprocess.run(command, input=script + b"alive", capture_output=True, timeout=30, check=False,
                         env={"PATH": str(applets)})
    assert out.returncode == 0, out.stderr
    assert (ws / "a.txt").read_bytes() == b"alive"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("outside")
    return workspace


def test_shell_runs_in_the_workspace_with_env_cwd_and_exit_code(ws: Path) -> None:
    (ws / "sub").mkdir()
    value = "it's $HOME `x` \"q\"\nline"
    out = run(scripts.shell('pwd; printf %s "$V"; exit 3', tag="t1", cwd="sub", env={"V": value}, workspace=str(ws)))
    assert out.returncode == 3
    assert out.stdout.decode() == f"{ws.resolve()}/sub\n{value}"


def test_shell_cwd_is_confined(ws: Path) -> None:
    os.symlink(ws.parent / "outside", ws / "link")
    out = run(scripts.shell("pwd", tag="t", cwd="link", env={}, workspace=str(ws)))
    assert (out.returncode, out.stderr.decode()) == (1, "Unsafe path: link: it resolves outside the workspace through a symlink\n")
    out = run(scripts.shell("pwd", tag="t", cwd="nope", env={}, workspace=str(ws)))
    assert (out.returncode, out.stderr.decode()) == (1, "Invalid arguments for shell: cwd nope is not a directory in the workspace\n")


def test_write_then_read_is_binary_safe_and_confined(ws: Path) -> None:
    data = bytes(range(256)) * 500  # within what read_file sends whole (2 * 64 KiB)
    out = run(scripts.write_file("a/b/c.bin", len(data), workspace=str(ws)), data + b"ignored tail")
    assert out.returncode == 0, out.stderr
    assert (ws / "a" / "b" / "c.bin").read_bytes() == data
    assert not [p for p in (ws / "a" / "b").iterdir() if p.name.endswith(".tmp")]
    out = run(scripts.read_file("a/b/c.bin", workspace=str(ws)))
    assert (out.returncode, out.stdout) == (0, data)
    assert run(scripts.read_file("missing.txt", workspace=str(ws))).returncode == scripts.NOT_FOUND
    assert run(scripts.read_file("a", workspace=str(ws))).returncode == scripts.IS_DIRECTORY
    os.mkfifo(ws / "fifo")
    assert run(scripts.read_file("fifo", workspace=str(ws))).returncode == scripts.NOT_REGULAR
    assert run(scripts.write_file("fifo", 1, workspace=str(ws)), b"x").returncode == scripts.NOT_REGULAR
    os.symlink(ws.parent / "outside" / "secret.txt", ws / "leak")
    os.symlink(ws.parent / "outside", ws / "dirlink")
    assert run(scripts.read_file("leak", workspace=str(ws))).returncode == scripts.OUTSIDE
    assert run(scripts.read_file("dirlink/secret.txt", workspace=str(ws))).returncode == scripts.OUTSIDE
    assert run(scripts.write_file("dirlink/new.txt", 1, workspace=str(ws)), b"x").returncode == scripts.OUTSIDE
    assert not (ws.parent / "outside" / "new.txt").exists()
    os.symlink("a/b/c.bin", ws / "inside")
    assert run(scripts.read_file("inside", workspace=str(ws))).stdout == data, "a link inside the workspace is fine"


def test_a_calls_leftover_processes_are_killed_when_it_ends(ws: Path) -> None:
    out = run(scripts.shell("(sleep 300 &) ; setsid sleep 301 & echo started", tag="leftover-tag", cwd=None, env={},
                            workspace=str(ws)))
    assert (out.returncode, out.stdout) == (0, b"started\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _tagged("leftover-tag"):
        time.sleep(0.05)
    assert _tagged("leftover-tag") == []


def test_kill_call_ends_a_running_call_and_everything_it_started(ws: Path) -> None:
    script = scripts.shell("sleep 300 & setsid sleep 302 & wait", tag="kill-me", cwd=None, env={}, workspace=str(ws))
    proc = subprocess.Popen(scripts.boot_command(script), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(script)
    proc.stdin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(_tagged("kill-me")) < 3:
        time.sleep(0.05)
    assert len(_tagged("kill-me")) >= 3
    assert run(scripts.kill_call("kill-me")).returncode == 0
    assert proc.wait(timeout=10) != 0
    assert _tagged("kill-me") == []


def test_probe_archive_and_extract_round_trip(tmp_path: Path, ws: Path) -> None:
    assert run(scripts.probe(workspace=str(ws))).returncode == 0
    (ws / "d").mkdir()
    (ws / "d" / "f.txt").write_text("kept")
    tar = run(scripts.archive(limit=2**30, workspace=str(ws)))
    assert tar.returncode == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    out = run(scripts.extract(len(tar.stdout), workspace=str(fresh)), tar.stdout)
    assert out.returncode == 0, out.stderr
    assert (fresh / "d" / "f.txt").read_text() == "kept"


def test_a_sparse_file_stays_sparse_where_tar_can(tmp_path: Path, ws: Path) -> None:
    """Issue 32, item 4: a file of holes (``truncate -s``) was archived byte for byte. This machine's tar is GNU tar,
    which keeps it sparse both ways; busybox's cannot (the provider's archive limit stops that one)."""
    hole = 64 * 2**20
    with (ws / "holes").open("wb") as f:
        f.truncate(hole)
        f.seek(hole // 2)
        f.write(b"middle")
    tar = run(scripts.archive(limit=2**30, workspace=str(ws)))
    assert tar.returncode == 0, tar.stderr
    assert len(tar.stdout) < 2**20, f"a {hole} byte file of holes archived as {len(tar.stdout)} bytes"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert run(scripts.extract(len(tar.stdout), workspace=str(fresh)), tar.stdout).returncode == 0
    restored = fresh / "holes"
    assert restored.stat().st_size == hole
    assert restored.stat().st_blocks * 512 < 2**20, "the restore wrote the holes out"
    with restored.open("rb") as f:
        f.seek(hole // 2)
        assert f.read(6) == b"middle"


def test_the_archive_is_cut_in_the_pod_one_byte_past_the_limit(ws: Path) -> None:
    """A tar that cannot keep holes (busybox) streams them all: the Pod stops one byte past the limit, so the exec
    ends at once; tar's own exit code says the archive is not whole."""
    (ws / "noise.bin").write_bytes(os.urandom(3 * 2**20))
    cut = run(scripts.archive(limit=2**20, workspace=str(ws)))
    assert len(cut.stdout) == 2**20 + 1
    assert cut.returncode != 0, "tar did not finish its archive"
    whole = run(scripts.archive(limit=8 * 2**20, workspace=str(ws)))
    assert whole.returncode == 0, whole.stderr
    assert 3 * 2**20 < len(whole.stdout) < 4 * 2**20


def _tagged(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"DSB_CALL={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_call_that_the_oom_killer_hit_says_so(ws: Path) -> None:
    """In a memory cgroup of its own (as a container is), a call that outgrows the limit gets 137 and a line
    naming the out-of-memory killer; a call that does not gets nothing added."""
    parent = Path("/sys/fs/cgroup/memory")
    if not os.access(parent, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory hierarchy (root on this machine)")
    group = parent / f"dsb-test-oom-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text("40000000")
        files = (str(group / "memory.oom_control"),)

        def in_group(command: str) -> subprocess.CompletedProcess[bytes]:
            script = scripts.shell(command, tag="oom", cwd=None, env={}, workspace=str(ws), oom_files=files)
            enter = f"echo $$ > {group}/cgroup.procs; exec \"$@\""
            return subprocess.run(["/bin/sh", "-c", enter, "enter", *scripts.boot_command(script)], input=script,
                                  capture_output=True, timeout=60, check=False)

        fine = in_group("echo small")
        assert (fine.returncode, fine.stderr) == (0, b"")
        hit = in_group("head -c 300000000 /dev/zero | tail > /dev/null")
        assert hit.returncode == 137 and scripts.OOM_MESSAGE in hit.stderr.decode()
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # the killed processes are still leaving the group


@pytest.mark.parametrize("shell", ["sh", "busybox"])
def test_a_huge_sparse_file_is_read_as_its_first_and_last_bytes_only(ws: Path, tmp_path: Path, shell: str) -> None:
    """Code in the sandbox may leave a file of any size (a sparse one costs it nothing): read_file sends the first
    and last ``keep`` bytes out of the Pod and says the full size, never the whole file through the exec."""
    if shell == "busybox" and not BUSYBOX.exists():
        pytest.skip("needs /bin/busybox (scripts/node-prepare installs busybox-static)")
    run = partial(_run_in, _applets(tmp_path) if shell == "busybox" else None)
    keep = 1024
    size = 64 * 1024 * 1024
    with open(ws / "huge", "wb") as f:
        f.write(b"H" * keep + b"h")
        f.seek(size - keep - 1)  # a hole between
        f.write(b"t" + b"T" * keep)
    out = run(scripts.read_file("huge", workspace=str(ws), keep=keep))
    assert out.returncode == scripts.TRUNCATED, out.stderr
    assert out.stdout == b"H" * keep + b"T" * keep
    assert out.stderr.decode().strip() == str(size)
    small = bytes(range(256)) * 8  # exactly 2 * keep: sent whole
    (ws / "small").write_bytes(small)
    assert (run(scripts.read_file("small", workspace=str(ws), keep=keep)).returncode,
            run(scripts.read_file("small", workspace=str(ws), keep=keep)).stdout) == (0, small)
    odd = b"a" * keep + b"b" * 5000 + b"c" * keep  # the tail's start not on a block boundary
    (ws / "odd").write_bytes(odd)
    out = run(scripts.read_file("odd", workspace=str(ws), keep=keep))
    assert (out.returncode, out.stdout, out.stderr.strip()) == (scripts.TRUNCATED, b"a" * keep + b"c" * keep,
                                                                str(len(odd)).encode())


def test_a_cut_read_is_shown_as_its_first_and_last_bytes_and_its_size() -> None:
    """The provider's side of TRUNCATED: the result says how much was left out and keeps the full size."""
    out, err = OutputBuffer(8), OutputBuffer(4096)
    out.feed(b"HEADHEADTAILTAIL")
    err.feed(b"1000\n")
    result = read_result(scripts.TRUNCATED, "f", out, err)
    assert (result.exit_code, result.stdout_size) == (0, 1000)
    assert result.stdout.startswith("HEADHEAD") and result.stdout.endswith("TAILTAIL")
    assert "984 of 1000 bytes left out" in result.stdout
    whole = OutputBuffer(8)
    whole.feed(b"small")
    assert (read_result(0, "f", whole, err).stdout, read_result(0, "f", whole, err).stdout_size) == ("small", None)


def test_a_file_written_while_it_is_archived_does_not_fail_the_snapshot(tmp_path: Path, ws: Path) -> None:
    """Code in the sandbox may keep writing a file (a log, on purpose or not) while a snapshot is taken: GNU tar
    then exits 1, "file changed as we read it", with a whole archive. That is a snapshot (the file as it was read),
    never a failed one, or the sandbox's own code would keep every snapshot (and a suspend) from being taken.
    A tar standing in for GNU tar exits 1 here every time (a real writer would make it exit 1 only by luck)."""
    real = subprocess.run(["sh", "-c", "command -v tar"], capture_output=True, text=True, check=True).stdout.strip()
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "tar").write_text(f'#!/bin/sh\n[ "$1" = --help ] && exec {real} --help\n{real} "$@" || exit\n'
                              'echo "tar: ./app.log: file changed as we read it" >&2; exit 1\n')
    (fake / "tar").chmod(0o755)
    (ws / "app.log").write_text("line\n")
    script = scripts.archive(limit=2**30, workspace=str(ws))
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    out = subprocess.run(scripts.boot_command(script), input=script, capture_output=True, timeout=30, check=False,
                         env=env)
    assert out.returncode == 0, out.stderr
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert run(scripts.extract(len(out.stdout), workspace=str(fresh)), out.stdout).returncode == 0
    assert (fresh / "app.log").read_text() == "line\n"
    (fake / "tar").write_text(f'#!/bin/sh\n[ "$1" = --help ] && echo "busybox tar" && exit 0\n{real} "$@" || exit\n'
                              'exit 1\n')  # a tar without GNU's meaning of 1 (busybox): an error, as before
    out = subprocess.run(scripts.boot_command(script), input=script, capture_output=True, timeout=30, check=False,
                         env=env)
    assert out.returncode == 1

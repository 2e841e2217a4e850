"""Supervisor of one local tool call: every process the call starts dies with the call and with the worker.

Run as a script by the local provider, never imported (it starts in a few milliseconds with ``python -I -S``)::

    python -I -S _call_supervisor.py WORKER_PID SHELL -lc COMMAND

Why a process of its own: a process group alone is escaped by ``setsid cmd &``, and a parent-death signal
(``PR_SET_PDEATHSIG``) set on the shell is not inherited by the shell's children, so after a SIGKILL of the
worker nothing would be left to kill them. This supervisor

* asks the kernel for SIGTERM when the worker dies (``PR_SET_PDEATHSIG``), and exits at once if the
  worker died before it could ask;
* is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process that leaves the call's group and whose
  parent exits is re-parented here rather than to init, so it stays findable as a descendant;
* runs the shell in a process group of its own (with ``PR_SET_PDEATHSIG=SIGKILL``, should this
  supervisor itself be killed outright);
* when the shell exits, or on SIGTERM (the call was cancelled or timed out, the sandbox destroyed, or the
  worker died), kills the shell's group and every descendant, reaps them, and exits with the shell's
  status (``128 + n`` for death by signal ``n``, as a shell reports it).

What it cannot catch: processes that another service starts on the call's behalf (``systemd-run``, ``at``,
a daemon reached over a socket). The local provider is no security boundary.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def _descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, found through /proc's parent links."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_all(me: int, group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
    for pid in _descendants(me):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _reap_everything(me: int, group: int) -> None:
    # Killed processes' children are re-parented here (we are a subreaper), so repeat until none is left.
    for _ in range(1000):
        _kill_all(me, group)
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        if not _descendants(me):
            return


def main(argv: list[str]) -> int:
    worker, command = int(argv[1]), argv[2:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != worker:
        return 137  # the worker died before we could ask to be told: start nothing
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # the shell
        try:
            os.setpgid(0, 0)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                # The supervisor died between the fork and the line above (a cancel's SIGTERM arriving before
                # its handlers are installed): no death signal will come, so start nothing.
                os._exit(137)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(command[0], command)
        except OSError as e:
            os.write(2, f"{command[0]}: {e.strerror}\n".encode())
        os._exit(127)
    try:
        os.setpgid(pid, pid)  # also here, so the group exists whichever of the two runs first
    except OSError:
        pass

    def stop(_signum: int, _frame: object) -> None:
        _kill_all(me, pid)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    status = None
    while status is None:
        try:
            done, st = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if done == pid:
            status = st
    _reap_everything(me, pid)
    if status is None:
        return 137
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The POSIX sh scripts a ``kubernetes`` sandbox runs for each tool call (what the image must have: ``sh``,
``dd``, ``head``, ``cat``, ``tr``, ``mkdir``, ``mv``, ``readlink``, ``tar``; busybox has them all).

Every exec has the same command line, :data:`BOOT`: ``sh -c 'eval "$(dd bs=1 count=N)"' dsb N``. The script
itself, and anything after it (a file's contents, a snapshot's archive), comes on stdin. The script is read one
byte at a time because what follows it belongs to the script: busybox's ``head -c`` reads a whole buffer from a
pipe, so it swallowed the start of a file's contents (the test node's busybox image wrote empty files). So nothing of a call but its
length is in the exec URL, which API servers and kubelets log: not the per-call env (it may hold secrets), not
the command. Values are single-quoted (:func:`quote`), which sh takes literally whatever they hold.

Confinement is the other providers': a path is relative (``safe_relative_path`` already refused ``..`` and
absolute paths) and every directory on the way, and a symlink at the end, must resolve inside the workspace.
Exit codes of the file scripts are the provider's own protocol (:data:`NOT_FOUND` ...), mapped to the contract's
result texts in Python.
"""

from __future__ import annotations

from collections.abc import Mapping

from durable_sandbox.providers.kubernetes_template import WORKSPACE
from durable_sandbox.providers.output import OUTPUT_KEEP_BYTES

__all__ = ["BOOT", "boot_command", "kill_call", "make_workspace", "quote", "read_file", "reset_processes", "shell", "write_file"]

BOOT = 'eval "$(dd bs=1 count="$1" 2>/dev/null)"'
NOT_FOUND, IS_DIRECTORY, OUTSIDE, NOT_REGULAR, NO_DIRECTORY, CANNOT = 64, 65, 66, 67, 68, 69
TRUNCATED = 70  # read_file: stdout is the file's first and last ``keep`` bytes, stderr its full size
PROBE_MISSING = 127
CALL_VARIABLE = "DSB_CALL"


def quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def boot_command(script: bytes) -> list[str]:
    return ["/bin/sh", "-c", BOOT, "dsb", str(len(script))]


# Kills every process whose environment carries the call's tag, except the shell running this (children that
# left the process group or were re-parented to the container's init still carry it).
_KILL_TAGGED = r"""
dsb_kill() {
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    case "$(tr '\000' '\n' 2>/dev/null < "$d/environ")" in
      *"$1"*) kill -9 "$p" 2>/dev/null ;;
    esac
  done
}
"""

# Resolves a relative directory inside the workspace, one component at a time, creating it when $2 is
# "create"; prints the physical path. Fails with the protocol's code when a component is missing (NOT_FOUND),
# not a directory (NO_DIRECTORY) or leads outside (OUTSIDE).
_CONFINE = rf"""
ws=$(cd -P -- "$DSB_WS" && pwd -P) || exit {CANNOT}
dsb_inside() {{ case "$1/" in "$ws"/*) return 0 ;; esac; return 1; }}
dsb_dir() {{
  cur=$ws
  old_ifs=$IFS; IFS=/; set -f
  for c in $1; do
    if [ -z "$c" ] || [ "$c" = . ]; then continue; fi
    if [ ! -e "$cur/$c" ] && [ ! -L "$cur/$c" ]; then
      [ "$2" = create ] || exit {NOT_FOUND}
      mkdir -- "$cur/$c" || exit {CANNOT}
    fi
    [ -d "$cur/$c" ] || exit {NO_DIRECTORY}
    cur=$(cd -P -- "$cur/$c" && pwd -P) || exit {CANNOT}
    dsb_inside "$cur" || exit {OUTSIDE}
  done
  IFS=$old_ifs; set +f
}}
dsb_target() {{
  dsb_dir "$1" "$3"
  f="$cur/$2"
  if [ -L "$f" ]; then
    f=$(readlink -f -- "$f") || exit {OUTSIDE}
    dsb_inside "$f" || exit {OUTSIDE}
  fi
}}
"""


# The container's count of processes the out-of-memory killer ended (cgroup v2, then v1; 0 where neither is
# readable, e.g. under gVisor): a call whose count moved says so, since its exit code alone (137) does not.
_OOM_COUNT = r"""
dsb_oom() {
  for f in $DSB_OOM_FILES; do
    if [ -r "$f" ]; then
      while read -r k v; do [ "$k" = oom_kill ] && { echo "$v"; return; }; done < "$f"
    fi
  done
  echo 0
}
"""
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")  # the container's own
OOM_MESSAGE = ("the out-of-memory killer ended a process of this call (the sandbox's memory limit); raise the "
               "template's resources.limits.memory")


def _split(path: str) -> tuple[str, str]:
    parent, _, base = path.rpartition("/")
    return parent or ".", base


def _workspace(workspace: str) -> str:
    return f"DSB_WS={quote(workspace)}"


def shell(command: str, *, tag: str, cwd: str | None, env: Mapping[str, str], workspace: str = WORKSPACE,
          oom_files: tuple[str, ...] = OOM_FILES) -> bytes:
    """A shell call: the command under ``sh -c`` in the workspace (or ``cwd`` in it), stdin from /dev/null, its
    processes tagged so that a timeout, and the call's end, kill every one of them."""
    lines = [_KILL_TAGGED, _OOM_COUNT, _workspace(workspace), f"DSB_OOM_FILES={quote(' '.join(oom_files))}",
             f"export {CALL_VARIABLE}={quote(tag)}"]
    lines += [f"export {name}={quote(value)}" for name, value in env.items()]
    if cwd is None:
        lines.append('cd -- "$DSB_WS" || exit 1')
    else:
        unsafe = f"Unsafe path: {cwd}: it resolves outside the workspace through a symlink"
        missing = f"Invalid arguments for shell: cwd {cwd} is not a directory in the workspace"
        lines += [
            _CONFINE,
            # In a subshell: its exit codes are the protocol's, never mistaken for the command's.
            f"d=$(dsb_dir {quote(cwd)} find; printf '%s' \"$cur\"); st=$?",
            f"case $st in 0) ;; {OUTSIDE}) printf '%s\\n' {quote(unsafe)} >&2; exit 1 ;;"
            f" *) printf '%s\\n' {quote(missing)} >&2; exit 1 ;; esac",
            'cd -- "$d" || exit 1',
        ]
    lines += [
        "oom=$(dsb_oom)",
        f"/bin/sh -c {quote(command)} </dev/null",
        "rc=$?",
        f'[ "$(dsb_oom)" = "$oom" ] || printf \'\\n%s\\n\' {quote(OOM_MESSAGE)} >&2',
        f'dsb_kill "{CALL_VARIABLE}=$DSB_CALL"',  # nothing of the call outlives it
        "exit $rc",
    ]
    return "\n".join(lines).encode()


def kill_call(tag: str) -> bytes:
    return "\n".join([_KILL_TAGGED, f"dsb_kill {quote(f'{CALL_VARIABLE}={tag}')}"]).encode()


# Passes over /proc before giving up on processes that keep being started while they are ended (a fork bomb).
RESET_PASSES = 100


def reset_processes() -> bytes:
    """Ends every process in the container but the keep-alive's: what a call left that its tag does not find
    (``env -i`` drops the tag; ``setsid``, ``nohup`` and a double fork keep it). The keep-alive is PID 1 and
    whatever it forks itself (its ``sleep``, restarted when ended), known by PID 1's session: the container runtime
    starts PID 1 and every exec in a session of its own (runc's ``setsid`` for each), and no process can join
    another session, so nothing a call started is in PID 1's (re-parenting to PID 1 keeps the session). Pass
    after pass until none is left alive (zombies excepted: nothing runs in them); CANNOT when processes keep
    appearing (or when PID 1 leads no session, so the keep-alive's own cannot be told apart)."""
    return rf"""
read -r st 2>/dev/null < /proc/1/stat; set -- ${{st##*) }}
[ "$4" = 1 ] && keep=1 || keep=none
n=0
while :; do
  left=0
  for d in /proc/[0-9]*; do
    p=${{d#/proc/}}
    [ "$p" = 1 ] || [ "$p" = "$$" ] && continue
    read -r st 2>/dev/null < "$d/stat" || continue
    set -- ${{st##*) }}
    [ "$1" = Z ] || [ "$4" = "$keep" ] && continue
    kill -9 "$p" 2>/dev/null && left=1
  done
  [ "$left" = 0 ] && exit 0
  n=$((n + 1))
  [ "$n" -ge {RESET_PASSES} ] && {{ echo "processes kept being started while they were ended (PID 1's session: $keep)" >&2; exit {CANNOT}; }}
  sleep 0.05
done
""".encode()


def read_file(path: str, *, workspace: str = WORKSPACE, keep: int = OUTPUT_KEEP_BYTES, tag: str = "") -> bytes:
    """A regular file's bytes on stdout; one over ``2 * keep`` bytes (code in the sandbox may leave a file of any
    size, a sparse one for free) only as its first and last ``keep`` bytes, exit :data:`TRUNCATED` and its size
    on stderr: what leaves the Pod is bounded whatever the file, never all of it through the exec. Its size from
    ``ls`` (``wc -c`` where that fails); the tail read from the block before it (``dd``), its extra bytes dropped.
    ``tag``: marks its processes (as a shell call's), so that :func:`kill_call` ends a read that never ends."""
    parent, base = _split(path)
    whole, block = 2 * keep, 4096
    return "\n".join([
        _workspace(workspace), f"export {CALL_VARIABLE}={quote(tag)}", _CONFINE, f"dsb_target {quote(parent)} {quote(base)} find",
        f'[ -e "$f" ] || exit {NOT_FOUND}',
        f'[ -d "$f" ] && exit {IS_DIRECTORY}',
        f'[ -f "$f" ] || exit {NOT_REGULAR}',
        'set -f; set -- $(ls -lnd -- "$f" 2>/dev/null); s=${5:-}; set +f',
        f'case $s in ""|*[!0-9]*) s=$(wc -c < "$f") || exit {CANNOT}; s=$((s + 0)) ;; esac',
        # Bounded even if the file grew since: never more than the whole of a small file.
        f'[ "$s" -le {whole} ] && exec head -c {whole} -- "$f"',
        f'head -c {keep} -- "$f"',
        f't=$((s - {keep})); b=$((t / {block}))',
        f'dd if="$f" bs={block} skip=$b 2>/dev/null | {{ dd bs=1 count=$((t - b * {block})) of=/dev/null 2>/dev/null;'
        f' head -c {keep}; }}',
        f'printf "%s\\n" "$s" >&2; exit {TRUNCATED}',
    ]).encode()


def write_file(path: str, size: int, *, workspace: str = WORKSPACE) -> bytes:
    """Then ``size`` bytes of contents follow on stdin: written to a temp file beside the target, renamed over it."""
    parent, base = _split(path)
    return "\n".join([
        _workspace(workspace), _CONFINE, f"dsb_target {quote(parent)} {quote(base)} create",
        f'[ -d "$f" ] && exit {IS_DIRECTORY}',
        f'if [ -e "$f" ] && [ ! -f "$f" ]; then exit {NOT_REGULAR}; fi',
        't="$f.dsb-$$.tmp"',
        f'head -c {size} > "$t" || {{ rm -f -- "$t"; exit {CANNOT}; }}',
        f'mv -f -- "$t" "$f" || {{ rm -f -- "$t"; exit {CANNOT}; }}',
    ]).encode()


def make_workspace(workspace: str = WORKSPACE) -> bytes:
    """The workspace directory made where the image does not have it (a Pod whose template mounts no volume
    there); run ahead of :func:`probe` in the same exec, whose writability check says when it failed."""
    return f"mkdir -p -- {quote(workspace)} 2>/dev/null\n".encode()


def probe(*, workspace: str = WORKSPACE) -> bytes:
    """What a sandbox needs of its image, checked once it runs: exit PROBE_MISSING naming what is missing."""
    tools = "dd head cat tr mkdir mv rm readlink tar"
    return (f'for t in {tools}; do command -v "$t" >/dev/null 2>&1 || {{ echo "$t" >&2; exit {PROBE_MISSING}; }}; done\n'
            f"[ -w {quote(workspace)} ] || {{ echo 'the workspace is not writable' >&2; exit {CANNOT}; }}").encode()


def archive(*, limit: int, workspace: str = WORKSPACE) -> bytes:
    """The workspace as a tar stream on stdout (the volume's contents, not the container's root filesystem), at
    most ``limit + 1`` bytes of it; the exit code is tar's.

    Sparse files stay sparse where the image's tar can (GNU tar's ``-S``: a 2 GiB file of holes is a few KiB of
    archive); busybox's tar cannot, and writes the holes out. So the stream is cut in the Pod one byte past the
    limit (tar then dies of SIGPIPE): the provider, which counts what it reads, fails the snapshot there, and the
    exec ends at once instead of streaming the rest (closing an exec's websocket does not stop its command).

    A file written while it is read (code in the sandbox still writing a log) makes GNU tar exit 1, "file changed
    as we read it", with the archive whole: that file is archived as it was read, and the snapshot is taken (exit
    0), or the sandbox's own processes could keep every snapshot, and so every suspend, from being taken."""
    return "\n".join([
        f"cd -- {quote(workspace)} || exit {CANNOT}",
        's=; case "$(tar --help 2>&1)" in *--sparse*) s=S ;; esac',
        # tar's exit code through fd 3, its archive through head to the exec's stdout (fd 4).
        f'{{ rc=$( {{ {{ tar "-c${{s}}f" - .; echo $? >&3; }} | head -c {limit + 1} >&4; }} 3>&1 ); }} 4>&1',
        # GNU tar's 1 in create mode is "some files differ" (changed while read: a process of the sandbox still
        # writing one), with the archive whole: a snapshot, not a failure. Only GNU tar's (the one with --sparse).
        '[ "${rc:-1}" = 1 ] && [ -n "$s" ] && exit 0',
        'exit "${rc:-1}"',
    ]).encode()


def extract(size: int, *, workspace: str = WORKSPACE) -> bytes:
    """Then ``size`` bytes of a tar archive follow on stdin, extracted into the (fresh) workspace."""
    return f"cd -- {quote(workspace)} || exit {CANNOT}\nhead -c {size} | tar -xf -".encode()

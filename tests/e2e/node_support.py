"""The test node: a control plane of its own with a real node (kubelet, kube-scheduler, the host's containerd),
shared by every test of a session that asks for the ``node_cluster`` fixture (docs/testing.md, "The node").

The node is machine-wide (its directories, bridges, kubepods cgroups, 10.0.0.1, sysctls), and other engineers
run tests from other worktrees at the same time: the fixture holds the machine-wide node lock for the whole
session, from before the node starts until after the machine has been checked for leftovers, and hands the
lock to ``controlplane up --node`` (``--node-lock-fd``). Nothing is ever pulled: images come from local builds
(``buildah``) imported into the node's containerd (``ctr images import``), cached by content hash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .controlplane import (
    PROJECT_ROOT,
    ControlPlane,
    build_controlplane,
    start_control_plane,
    stop_control_plane,
)

PREPARE_SCRIPT = PROJECT_ROOT / "scripts" / "node-prepare"
NODE_NAME = "dsb-node"
# Both are tests/controlplane/node.go's constants.
LOCK_PATH = Path("/run/lock/durable-sandbox-node.lock")
NODE_DIRS = (Path("/var/lib/durable-sandbox-node"), Path("/run/durable-sandbox-node"))
# Another session's node may hold the machine for its whole run.
LOCK_TIMEOUT_S = float(os.environ.get("DURABLE_SANDBOX_NODE_LOCK_TIMEOUT", 45 * 60))
PREPARE_TIMEOUT_S = 30 * 60
READY_TIMEOUT_S = 300.0
CACHE = Path(os.environ.get("DURABLE_SANDBOX_NODE_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "durable-sandbox" / "node")


def run(cmd: list[str], *, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


@dataclass
class NodeCluster(ControlPlane):
    """A :class:`ControlPlane` with a Ready node: Pods run. ``containerd`` is the node's containerd socket."""

    node: str = NODE_NAME
    containerd: str = ""
    gvisor: bool = False  # RuntimeClass ``gvisor`` is there (``controlplane up --node-gvisor``)

    def import_archive(self, archive: Path) -> None:
        run(["ctr", "--address", self.containerd, "--namespace", "k8s.io", "images", "import", str(archive)])

    def load_image(self, image: str, ref: str | None = None) -> str:
        """Import the buildah image ``image`` into the node as ``ref`` (default: its own name); returns ``ref``.
        The OCI archive is cached by the image's id."""
        ref = ref or image
        image_id = run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image]).strip()
        self.import_archive(_archive(f"{image_id}\n{ref}", image, ref))
        return ref

    def build_image(self, context: Path, ref: str, dockerfile: Path | None = None,
                    build_args: dict[str, str] | None = None) -> str:
        """Build ``context`` (its Dockerfile, or ``dockerfile``) with buildah and import it as ``ref``; cached by
        a hash of every file of the context, the Dockerfile and the build arguments, so an unchanged context
        costs one import."""
        key, tag = build_test_image(context, ref, dockerfile, build_args)
        self.import_archive(_archive(key, tag, ref))
        return ref


def build_test_image(context: Path, ref: str, dockerfile: Path | None = None,
                     build_args: dict[str, str] | None = None, *, local: bool = False) -> tuple[str, str]:
    """``buildah bud`` of ``context`` (with ``--build-arg`` for each of ``build_args``) unless an image of the same
    content hash (the context, the Dockerfile, the build arguments) exists; (hash, buildah tag). ``local``: the
    image must be in buildah's store (the base of another build), its cached archive alone does not do."""
    dockerfile = dockerfile or context / "Dockerfile"
    args = sorted((build_args or {}).items())
    key = _content_hash(context, dockerfile, "\n".join([ref, *(f"{k}={v}" for k, v in args)]))
    tag = f"localhost/dsb-test-build:{key}"
    exists = subprocess.run(["buildah", "inspect", "--type", "image", tag], capture_output=True, check=False)
    if exists.returncode != 0 and (local or not (CACHE / "images" / f"{key}.tar").exists()):
        run(["buildah", "bud", "--quiet", "--isolation", "chroot", "--pull=never", "--layers", "--tag", tag,
             *(a for k, v in args for a in ("--build-arg", f"{k}={v}")),
             "--file", str(dockerfile), str(context)], timeout=1800)
    return key, tag


def _content_hash(context: Path, dockerfile: Path, ref: str) -> str:
    h = hashlib.sha256(f"{ref}\n".encode())
    h.update(dockerfile.read_bytes())
    for path in sorted(p for p in context.rglob("*") if p.is_file() or p.is_symlink()):
        h.update(f"\0{path.relative_to(context)}\0{path.lstat().st_mode:o}\0".encode())
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()[:16]


def _archive(key: str, image: str, ref: str) -> Path:
    """The OCI archive of ``image`` named ``ref`` (what containerd will call it), made once per ``key``."""
    name = hashlib.sha256(key.encode()).hexdigest()[:16] if "\n" in key else key
    archive = CACHE / "images" / f"{name}.tar"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        tmp = archive.with_suffix(f".tmp.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        run(["buildah", "push", "--quiet", image, f"oci-archive:{tmp}:{ref}"], timeout=1800)
        tmp.rename(archive)
    return archive


BUSYBOX = "localhost/busybox:dsb-test"


def busybox_context() -> Path:
    """A build context for a small test image: the host's static busybox (sh, tar for ``kubectl cp``, nc, httpd)."""
    context = CACHE / "busybox-context"
    context.mkdir(parents=True, exist_ok=True)
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise RuntimeError("/bin/busybox missing: scripts/node-prepare installs busybox-static")
    if not (context / "busybox").exists() or (context / "busybox").read_bytes() != busybox.read_bytes():
        shutil.copy2(busybox, context / "busybox")
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\n"
        'RUN ["/bin/busybox", "--install", "-s", "/bin"]\nRUN ["/bin/mkdir", "-m", "1777", "/tmp"]\n'
        'CMD ["/bin/sh"]\n'
    )
    return context


def busybox_image(cluster: NodeCluster) -> str:
    """The busybox test image, imported into the node as ``localhost/busybox:dsb-test``."""
    return cluster.build_image(busybox_context(), BUSYBOX)


GVISOR_SCRIPT = PROJECT_ROOT / "scripts" / "gvisor-build"
# tests/controlplane/node.go's gvisorRuntimeClass: Pods naming it run under runsc on the test node.
GVISOR_RUNTIME_CLASS = "gvisor"

_prepared: dict[Path, Path | RuntimeError] = {}


def _script_output(script: Path) -> Path:
    """The path ``script`` prints last on stdout, once per session; its failure is remembered and raised again."""
    if script not in _prepared:
        try:
            proc = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True,
                                  timeout=PREPARE_TIMEOUT_S, check=False)
            if proc.returncode != 0 or not proc.stdout.strip():
                raise RuntimeError(f"{script.relative_to(PROJECT_ROOT)} failed with exit code {proc.returncode} "
                                   "(its stderr says why)")
            _prepared[script] = Path(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired) as exc:
            _prepared[script] = RuntimeError(f"{script.relative_to(PROJECT_ROOT)}: {exc}")
        except RuntimeError as exc:
            _prepared[script] = exc
    found = _prepared[script]
    if isinstance(found, RuntimeError):
        raise found
    return found


def prepare_node() -> tuple[Path, Path | None]:
    """scripts/node-prepare (installs what is missing, builds the pause image) and scripts/gvisor-build, once per
    session; returns the pause image's archive and gVisor's directory (None if its build failed: the node then
    runs without the ``gvisor`` RuntimeClass and :func:`require_gvisor` fails the tests that need it). The e2e
    conftest calls it after collection when node tests are selected, so package installs and builds never count
    against a test's timeout; a failure is remembered and raised by every node test."""
    try:
        pause = _script_output(PREPARE_SCRIPT)
    except RuntimeError as exc:
        raise RuntimeError(f"the test node cannot start: {exc}") from None
    try:
        gvisor: Path | None = _script_output(GVISOR_SCRIPT)
    except RuntimeError:
        gvisor = None
    return pause, gvisor


def require_gvisor(cluster: NodeCluster) -> str:
    """The RuntimeClass of gVisor on ``cluster``'s node; fails (not skips: CI must run these) when it has none."""
    if not cluster.gvisor:
        _script_output(GVISOR_SCRIPT)  # raises the build's failure
        raise RuntimeError("this node was started without --node-gvisor")
    return GVISOR_RUNTIME_CLASS


@contextlib.contextmanager
def node_lock(timeout: float = LOCK_TIMEOUT_S) -> Iterator[int]:
    """Hold the machine-wide node lock (waiting for another session's node to stop); yields its descriptor."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = LOCK_PATH.read_text().strip() or "?"
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"the test node is taken: pid {holder} holds {LOCK_PATH} (another test session "
                                       f"or scripts/dev-cluster) and did not let go within {timeout:.0f}s") from None
                if not said:
                    print(f"\nwaiting up to {timeout:.0f}s for the machine's node (pid {holder} holds {LOCK_PATH})",
                          file=sys.stderr)
                    said = True
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)


# ---- what a node may leave on the machine, for the teardown checks ----

NODE_PROGRAMS = {"containerd", "containerd-shim-runc-v2", "runc", "socat", "ctr", "containerd-shim-runsc-v1.bin", "runsc"}
HOST_PATHS = ("/run/containerd", "/var/lib/cni", "/var/lib/kubelet", "/var/log/containers", "/var/log/pods",
              "/usr/libexec/kubernetes", "/opt/containerd", "/etc/cni/net.d", "/run/netns", *map(str, NODE_DIRS))
SYSCTL_GLOBS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/*", "net/ipv4/conf/default/*", "net/ipv6/conf/all/forwarding",
                "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_max*",
                "net/bridge/*")


@dataclass(frozen=True)
class HostState:
    processes: frozenset[str]
    mounts: frozenset[str]
    links: frozenset[str]
    routes: frozenset[str]
    cgroups: frozenset[str]
    paths: frozenset[str]
    sysctls: tuple[tuple[str, str], ...]
    iptables: str

    def left_by_node(self, before: HostState) -> dict[str, object]:
        """What is here now and was not before (a node that cleaned an earlier one's leftovers removed things:
        that is not a difference), and sysctls or iptables rules that changed."""
        left: dict[str, object] = {}
        for name in ("processes", "mounts", "links", "routes", "cgroups", "paths"):
            extra = sorted(getattr(self, name) - getattr(before, name))
            if extra:
                left[name] = extra
        changed = {k: (dict(before.sysctls).get(k), v) for k, v in self.sysctls if dict(before.sysctls).get(k) != v}
        if changed:
            left["sysctls (before, after)"] = changed
        if self.iptables != before.iptables:
            left["iptables"] = f"before:\n{before.iptables}\nafter:\n{self.iptables}"
        return left


def _node_processes() -> set[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = Path(os.readlink(entry / "exe").removesuffix(" (deleted)")).name
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        line = " ".join(args)
        if (exe in NODE_PROGRAMS and any(str(d) in line for d in NODE_DIRS)) or "bind=10.0.0.1," in line \
                or (exe == "controlplane" and args[1:2] in (["kubelet"], ["kube-scheduler"])) or exe == "pause" \
                or exe == "kube-router" \
                or exe == "agent-sandbox-controller":  # tests/e2e/netpol_support.py's, agent_sandbox_support.py's
            found.add(f"{entry.name} {line[:200]}")
    return found


def _mounts() -> set[str]:
    """Mounts a node makes: below its own directories and the host paths containerd and the kubelet use, and
    any mount whose options name its directories (containerd's overlay snapshots)."""
    out = set()
    prefixes = [str(d) for d in NODE_DIRS] + ["/var/lib/kubelet", "/run/containerd", "/run/netns", "/var/run/netns"]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4]
        if any(point == p or point.startswith(p + "/") for p in prefixes) or any(str(d) in line for d in NODE_DIRS):
            out.add(point)
    return out


def _cgroups() -> set[str]:
    root = Path("/sys/fs/cgroup")
    return {str(p) for h in root.iterdir() if h.is_dir() for p in h.iterdir() if p.is_dir()} if root.exists() else set()


def _sysctls() -> tuple[tuple[str, str], ...]:
    values = {}
    for pattern in SYSCTL_GLOBS:
        for path in sorted(Path("/proc/sys").glob(pattern)):
            try:
                values[str(path.relative_to("/proc/sys"))] = path.read_text().strip()
            except OSError:
                continue
    return tuple(sorted(values.items()))


def host_state() -> HostState:
    def lines(cmd: list[str]) -> frozenset[str]:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return frozenset(line.strip() for line in proc.stdout.splitlines() if line.strip())

    iptables = ""
    if shutil.which("iptables-save"):
        dump = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
        # Comments carry a timestamp, chain headers packet counters.
        iptables = "\n".join(line.split(" [")[0] for line in dump.splitlines() if not line.startswith("#"))
    links = lines(["ip", "-o", "link", "show"])
    return HostState(
        processes=frozenset(_node_processes()),
        mounts=frozenset(_mounts()),
        links=frozenset(line.split(": ")[1].split("@")[0] for line in links if ": " in line),
        routes=lines(["ip", "route", "show", "table", "all"]),
        cgroups=frozenset(_cgroups()),
        paths=frozenset(p for p in HOST_PATHS if Path(p).exists()),
        sysctls=_sysctls(),
        iptables=iptables,
    )


def start_node_cluster(binary: Path, workdir: Path, pause_archive: Path, lock_fd: int,
                       gvisor: Path | None = None) -> NodeCluster:
    extra = ["--node", NODE_NAME, "--node-image", str(pause_archive), "--node-lock-fd", str(lock_fd)]
    if gvisor is not None:
        extra += ["--node-gvisor", str(gvisor)]
    cp = start_control_plane(binary, workdir, extra_args=extra, pass_fds=(lock_fd,), ready_timeout=READY_TIMEOUT_S)
    info = json.loads((workdir / "ready.json").read_text())
    fields = {n: getattr(cp, n) for n, f in ControlPlane.__dataclass_fields__.items() if f.init}
    return NodeCluster(**fields, node=info["node"], containerd=info["containerd"], gvisor=gvisor is not None)


def session_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """The ``node_cluster`` fixture (tests/e2e/conftest.py): one node for the session, and after it stops a
    check, still under the lock, that it left nothing on the machine (a failure there errors the session)."""
    binary = build_controlplane()
    pause, gvisor = prepare_node()
    workdir = tmp_path_factory.mktemp("nodecluster")
    with node_lock() as fd:
        before = host_state()
        cluster = start_node_cluster(binary, workdir, pause, fd, gvisor)
        try:
            yield cluster
        finally:
            stop_control_plane(cluster.process)
            left = host_state().left_by_node(before)
            if left:
                raise AssertionError(f"the test node left this on the machine (logs in {workdir}/logs):\n"
                                     + json.dumps(left, indent=2, default=str))

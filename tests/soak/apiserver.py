"""A kube-apiserver of the soak's own on the test control plane's etcd, so the soak can kill and restart the
API server the operators talk to while etcd (the cluster's state) lives on.

The control plane's own apiserver keeps serving the test's kubectl (two apiservers on one etcd is how an HA
control plane runs); only the operators' kubeconfig points at this one. It is restarted on the same port, so
clients reconnect to the same address, as they would to a restarted static Pod."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
from pathlib import Path

import httpx

from tests.e2e.conftest import ControlPlane, _die_with_parent, wait_until

READY_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RestartableAPIServer:
    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp = cp
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = cp.dir / "pki"
        self.etcd = json.loads((cp.dir / "ready.json").read_text())["etcd"]
        self.port = _free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.dir / "kubeconfig"
        # The admin credentials of the control plane, pointed at this server.
        self.kubeconfig.write_text(cp.kubeconfig.read_text().replace(cp.server, self.server))
        self.kubeconfig.chmod(0o600)
        self.process: subprocess.Popen[bytes] | None = None
        self._tls = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        self._tls.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))

    def _args(self) -> list[str]:
        p = self.pki
        return [
            str(self.cp.binary), "kube-apiserver",
            f"--etcd-servers={self.etcd}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--cert-dir={self.dir / 'certs'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--authorization-mode=RBAC",
            # The same issuer and keys as the control plane's apiserver: tokens are valid on both.
            f"--service-account-issuer={self.cp.server}",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ]

    def launch(self) -> None:
        """Start the process; it serves once :meth:`ready`."""
        log = (self.dir / "kube-apiserver.log").open("ab")
        self.process = subprocess.Popen(self._args(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        log.close()

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the soak's kube-apiserver exited with {self.process.returncode}; see "
                               f"{self.dir / 'kube-apiserver.log'}")
        try:
            response = httpx.get(f"{self.server}/readyz", verify=self._tls, timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def wait_ready(self) -> None:
        wait_until(self.ready, READY_TIMEOUT_S, f"the soak's kube-apiserver on {self.server} to be ready", interval=0.2)

    def kill(self) -> None:
        """SIGKILL: the server dies with requests and watches open, as on a node failure."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()

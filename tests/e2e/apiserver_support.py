"""A kube-apiserver of a test's own on the test control plane's etcd, so a test (the soak,
e2e/test_operator_apiserver_restart.py) can kill and restart the API server the operators talk to while etcd
(the cluster's state) lives on; and :class:`StartingDiscoveryProxy`, which holds the window of a starting API
server open for as long as a test needs it.

The control plane's own apiserver keeps serving the test's kubectl (two apiservers on one etcd is how an HA
control plane runs); only the operators' kubeconfig points at this one. It is restarted on the same port, so
clients reconnect to the same address, as they would to a restarted static Pod."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
import threading
from pathlib import Path

import aiohttp
import httpx
from aiohttp import web

from tests.e2e.controlplane import ControlPlane, _die_with_parent, wait_until
from tests.ports import free_port

READY_TIMEOUT_S = 180.0


class RestartableAPIServer:
    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp = cp
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = cp.dir / "pki"
        self.etcd = json.loads((cp.dir / "ready.json").read_text())["etcd"]
        self.port = free_port()
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
            raise RuntimeError(f"the test's kube-apiserver exited with {self.process.returncode}; see "
                               f"{self.dir / 'kube-apiserver.log'}")
        try:
            response = httpx.get(f"{self.server}/readyz", verify=self._tls, timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def wait_ready(self) -> None:
        wait_until(self.ready, READY_TIMEOUT_S, f"the test's kube-apiserver on {self.server} to be ready", interval=0.2)

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


# What a kube-apiserver that has just started answers for a CustomResourceDefinition's paths until its CRD
# informer has synced (measured on the e2e control plane: for 0.1-0.3 s `/apis` lists no custom group yet,
# then the group's paths answer this 503 for a few hundred ms more, before /readyz says ok).
STARTING_503 = {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "the request has been made before all known HTTP paths have been installed, please try again",
    "reason": "ServiceUnavailable", "code": 503,
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer",
               "proxy-authorization", "proxy-authenticate"}


class StartingDiscoveryProxy:
    """A plain-HTTP reverse proxy in front of a kube-apiserver (it authenticates upstream with the control
    plane's admin certificate) that can answer, for as long as :attr:`starting` is set, what a just-started API
    server answers for one API group: ``/apis`` without the group, and 503 ``the request has been made before
    all known HTTP paths have been installed`` for every path under ``/apis/<group>``. Everything else is
    passed through, watches streamed; when the upstream is down or drops a stream, the client's connection is
    dropped too, as a dying API server's would be. Test-only: it makes the few hundred milliseconds of a
    real restart's window last until the test has seen the operator meet it."""

    def __init__(self, api: RestartableAPIServer, group: str, workdir: Path) -> None:
        self.upstream = api.server
        self.group = group
        self._tls = api._tls
        self.port = free_port()
        self.server = f"http://127.0.0.1:{self.port}"
        self.kubeconfig = workdir / "proxy-kubeconfig"
        self.kubeconfig.write_text(api.kubeconfig.read_text().replace(api.server, self.server))
        self.kubeconfig.chmod(0o600)
        self.starting = threading.Event()
        # When set, only clients whose User-Agent contains it are answered from the window (e.g. "kopf/": kopf
        # meets it while the operator's own client does not, as if the server restarted between their requests).
        self.starting_only_for: str | None = None
        self.lock = threading.Lock()
        # (starting?, method, path without a trailing slash) of every request answered
        self.answered: list[tuple[bool, str, str]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def count(self, *, starting: bool, path: str, method: str = "GET") -> int:
        with self.lock:
            return sum(1 for s, m, p in self.answered if s == starting and m == method and p == path)

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="discovery-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the discovery proxy did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.run(self._main(ready))

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._tls), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        ) as session:
            app = web.Application(client_max_size=16 * 1024 * 1024)
            async def handle(request: web.Request) -> web.StreamResponse:
                return await self._handle(session, request)

            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()
            try:
                await self._stopped.wait()
            finally:
                await runner.cleanup()

    def _record(self, starting: bool, request: web.Request) -> None:
        with self.lock:
            self.answered.append((starting, request.method, request.path.rstrip("/") or "/"))

    async def _handle(self, session: aiohttp.ClientSession, request: web.Request) -> web.StreamResponse:
        only = self.starting_only_for
        starting = self.starting.is_set() and (only is None or only in request.headers.get("User-Agent", ""))
        path = request.path.rstrip("/")  # kopf asks for /apis, the kubernetes client for /apis/
        group_path = f"/apis/{self.group}"
        if starting and (path == group_path or path.startswith(group_path + "/")):
            self._record(True, request)
            return web.json_response(STARTING_503, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        if starting and path == "/apis":
            headers["Accept"] = "application/json"  # the plain APIGroupList, which is edited below
        body = await request.read()
        try:
            upstream = await session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                             data=body or None, allow_redirects=False)
        except (aiohttp.ClientError, OSError):
            return self._drop(request)
        async with upstream:
            if starting and path == "/apis" and upstream.status == 200:
                groups = await upstream.json()
                groups["groups"] = [g for g in groups.get("groups", []) if g.get("name") != self.group]
                self._record(True, request)
                return web.json_response(groups)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
            await response.prepare(request)
            self._record(starting, request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, OSError):
                self._drop(request)  # the API server died mid-stream: so does this connection
                return response
            await response.write_eof()
            return response

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        """Close the client's connection without an answer (nothing more is written to it)."""
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=502)

"""Commands in a Pod through the API server's ``pods/exec``: the WebSocket channel protocol, as kubectl speaks it.

The subprotocol offered first is ``v5.channel.k8s.io`` (Kubernetes 1.29+), then ``v4.channel.k8s.io``. Every
binary message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 status (a ``metav1.Status`` JSON that says
how the command ended: ``Success``, or ``NonZeroExitCode`` with the exit code in ``details.causes``), 4 resize;
v5 adds 255, *close*, so the client can end stdin (``[255, 0]``) while reading on. The exit code is only ever
taken from the status channel: a stream that ended without one says the command's end was not seen (the Pod
died, the connection broke), never a made-up success.

Connections come from ``kubernetes.aio``'s aiohttp pool and its authentication (bearer token, refreshed by the
client when it expires, or the client certificate on the pool's TLS context). Output goes to sinks as it
arrives (the caller bounds it); stdin is sent from an async iterator while output is read, so neither side can
block the other, and aiohttp's writer drains before each send (memory stays bounded both ways).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from durable_sandbox.providers.contract import ProviderError

if TYPE_CHECKING:  # aiohttp is imported when a stream is opened: every `dsb` command loads the registry
    import aiohttp

__all__ = ["ExecFailed", "ExecOutcome", "ExecRejected", "PodExec", "StreamBroken"]

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN_CHUNK = 64 * 1024


class ExecRejected(ProviderError):
    """The API server refused to start the exec (HTTP status before the upgrade): nothing ran."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = status in (429, 500, 502, 503, 504)


class StreamBroken(ProviderError):
    """The stream ended without the status message: whether and how the command ended is unknown."""


class ExecFailed(ProviderError):
    """The command could not be run (no such executable, the container is not running): a status of Failure
    without an exit code."""

    retryable = False

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ExecOutcome:
    exit_code: int
    status: dict[str, Any]


def exit_code_of(status: dict[str, Any]) -> int | None:
    """The exit code a status message reports; None for a Failure that is not a command's exit."""
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                with contextlib.suppress(TypeError, ValueError):
                    return int(cause.get("message"))
    return None


class PodExec:
    """Opens exec streams with a ``kubernetes.aio`` ApiClient's configuration and connection pool."""

    def __init__(self, api_client: Any, *, heartbeat: float | None = 30.0) -> None:
        self.api_client = api_client
        self.heartbeat = heartbeat
        self.negotiated: str | None = None  # the subprotocol of the last stream (what the server speaks)

    def _session(self) -> aiohttp.ClientSession:
        rest = self.api_client.rest_client
        if rest.pool_manager is None:
            rest.pool_manager = rest._create_pool_manager()
        session: aiohttp.ClientSession = rest.pool_manager
        return session

    async def _url_and_headers(self, namespace: str, pod: str, container: str, command: Sequence[str],
                               stdin: bool) -> tuple[str, dict[str, str]]:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
        query: list[tuple[str, str]] = [("container", container), ("stdout", "true"), ("stderr", "true")]
        if stdin:
            query.append(("stdin", "true"))
        query.extend(("command", part) for part in command)
        headers: dict[str, str] = dict(self.api_client.default_headers)  # User-Agent, impersonation if set
        await self.api_client.update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
        host = urlsplit(self.api_client.configuration.host)
        scheme = "wss" if host.scheme == "https" else "ws"
        base = host.path.rstrip("/")
        return urlunsplit((scheme, host.netloc, base + path, urlencode(query), "")), headers

    async def run(
        self,
        namespace: str,
        pod: str,
        container: str,
        command: Sequence[str],
        *,
        stdout: Callable[[bytes], Any],
        stderr: Callable[[bytes], Any],
        stdin: AsyncIterator[bytes] | None = None,
        what: str = "exec",
    ) -> ExecOutcome:
        """Run ``command`` and wait for its end. ``stdout``/``stderr`` get each chunk as it comes (a coroutine
        function's result is awaited, so a slow sink slows the stream down instead of piling chunks up)."""
        import aiohttp

        url, headers = await self._url_and_headers(namespace, pod, container, command, stdin is not None)
        try:
            ws = await self._session().ws_connect(url, protocols=PROTOCOLS, headers=headers, heartbeat=self.heartbeat,
                                                  max_msg_size=0, autoping=True)
        except aiohttp.WSServerHandshakeError as exc:
            raise ExecRejected(f"{what}: the API server refused the exec: HTTP {exc.status} {exc.message}",
                               exc.status) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ExecRejected(f"{what}: cannot reach the API server ({type(exc).__name__})", 503) from None
        async with ws:
            self.negotiated = ws.protocol
            if ws.protocol not in PROTOCOLS:
                raise StreamBroken(f"{what}: the API server speaks exec subprotocol {ws.protocol!r}, not v4 or v5")
            writer = asyncio.create_task(self._pump(ws, stdin)) if stdin is not None else None
            try:
                status = await self._read(ws, stdout, stderr, what)
            finally:
                if writer is not None:
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await writer
        code = exit_code_of(status)
        if code is None:
            message = str(status.get("message") or status)
            raise ExecFailed(f"{what}: the command could not be run: {message}", str(status.get("reason") or ""))
        return ExecOutcome(exit_code=code, status=status)

    async def _pump(self, ws: aiohttp.ClientWebSocketResponse, chunks: AsyncIterator[bytes]) -> None:
        async for chunk in chunks:
            for i in range(0, len(chunk), STDIN_CHUNK):
                await ws.send_bytes(bytes((STDIN,)) + chunk[i:i + STDIN_CHUNK])
        if ws.protocol == PROTOCOLS[0]:
            await ws.send_bytes(bytes((CLOSE, STDIN)))  # v5: end of stdin; output is still read

    async def _read(self, ws: aiohttp.ClientWebSocketResponse, stdout: Callable[[bytes], Any],
                    stderr: Callable[[bytes], Any], what: str) -> dict[str, Any]:
        import aiohttp

        status: dict[str, Any] | None = None
        status_bytes = bytearray()
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY:
                if message.type == aiohttp.WSMsgType.ERROR:
                    break
                continue
            data: bytes = message.data
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if not payload:
                continue  # the server opens each channel with an empty message
            if channel == STDOUT:
                result = stdout(payload)
            elif channel == STDERR:
                result = stderr(payload)
            elif channel == STATUS:
                status_bytes += payload
                with contextlib.suppress(ValueError):
                    status = json.loads(status_bytes)
                continue
            else:
                continue
            if asyncio.iscoroutine(result):
                await result
        if status is None:
            raise StreamBroken(f"{what}: the exec stream ended without saying how the command ended "
                               f"(the Pod stopped or the connection broke); the command may or may not have run")
        return status

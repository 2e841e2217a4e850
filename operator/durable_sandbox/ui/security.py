"""Who may use the web view, and how an action proves it came from the view's own page.

- **Token.** Every request but ``/healthz`` carries the server's token: as the ``?token=`` of the URL
  ``dsb ui`` prints (answered with a cookie and a redirect to the same URL without it, so the token does
  not stay in the address bar or the history), then as that cookie (``HttpOnly``, ``SameSite=Strict``, named
  for the port: cookies are not port-specific), or as ``Authorization: Bearer <token>`` for scripts. On
  the loopback address a random token is made unless one is given; anywhere else ``dsb ui`` refuses to
  start without ``--token`` (or ``$DSB_UI_TOKEN``).
- **Host.** On loopback, a request whose ``Host`` is not the server's own address is refused: a page that
  rebinds its DNS name to 127.0.0.1 reaches the port but not the cookie, and not this check either.
- **Actions.** Every action is a POST carrying the CSRF token of the pages this server rendered
  (:meth:`Guard.csrf_ok`), from the server's own origin; and only when ``dsb ui --allow-actions``.
- **Headers.** A strict Content-Security-Policy (scripts, styles and connections from the server itself
  only; nothing is ever fetched from elsewhere), no framing, no referrer to other sites (a URL may carry the token),
  ``no-store`` caching.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["Guard", "GuardMiddleware", "is_loopback"]

OPEN_PATHS = frozenset({"/healthz"})
HEADERS: Final[Sequence[tuple[bytes, bytes]]] = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # (with no-referrer, browsers send "Origin: null" on a POST)
    (b"cache-control", b"no-store"),
]  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Guard:
    host: str
    port: int
    token: str
    allow_actions: bool = False
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def cookie(self) -> str:
        return f"dsb_ui_{self.port}"

    @property
    def origin_hosts(self) -> frozenset[str]:
        """The ``Host`` values a request may carry (loopback only: elsewhere any name may lead here)."""
        names = {self.host, "localhost", "127.0.0.1"} if self.host in ("127.0.0.1", "localhost") else {self.host}
        if self.host in ("::1", "[::1]"):
            names = {"[::1]", "localhost"}
        return frozenset(f"{n}:{self.port}" for n in names)

    def token_ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token.encode())

    def csrf_ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.csrf.encode())

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """A POST's Origin (browsers send it on every POST): absent (a script with the token), or the very
        address the request was sent to (same origin)."""
        return origin is None or (host is not None and origin == f"http://{host}")


class GuardMiddleware:
    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        g = self.guard

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        if is_loopback(g.host) and headers.get("host") not in g.origin_hosts:
            await _plain(send_with_headers, 421, "This server answers only to its own address "
                                                 f"({', '.join(sorted(g.origin_hosts))}).")  # fmt: skip
            return
        if path in OPEN_PATHS:
            await self.app(scope, receive, send_with_headers)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        if given is not None and scope["method"] == "GET":
            if not g.token_ok(given):
                await _plain(send_with_headers, 401, "Wrong token: open the URL `dsb ui` printed.")
                return
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = path + (f"?{rest}" if rest else "")
            cookie = f"{g.cookie}={g.token}; Path=/; HttpOnly; SameSite=Strict"
            await _send(send_with_headers, 303, b"", [(b"location", location.encode()), (b"set-cookie", cookie.encode())])
            return
        if not (g.token_ok(_cookie(headers.get("cookie"), g.cookie)) or g.token_ok(_bearer(headers.get("authorization")))):
            await _plain(send_with_headers, 401, "This page needs the token: open the URL `dsb ui` printed "
                                                 "(it ends in ?token=...).")  # fmt: skip
            return
        if scope["method"] not in ("GET", "HEAD") and not g.origin_ok(headers.get("origin"), headers.get("host")):
            await _plain(send_with_headers, 403, "Refused: the request did not come from this server's pages.")
            return
        await self.app(scope, receive, send_with_headers)


def _cookie(header: str | None, name: str) -> str | None:
    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no token
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


def _bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


async def _plain(send: Send, status: int, text: str) -> None:
    await _send(send, status, (text + "\n").encode(), [(b"content-type", b"text/plain; charset=utf-8")])


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    start: dict[str, Any] = {"type": "http.response.start", "status": status,
                             "headers": [*headers, (b"content-length", str(len(body)).encode())]}  # fmt: skip
    await send(start)
    await send({"type": "http.response.body", "body": body})

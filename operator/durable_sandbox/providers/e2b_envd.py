"""Addressing a sandbox's envd (the daemon in it that runs processes and serves files): its URL, the routing
and token headers (a token never persisted: looked up again by a new process), the user older envd versions
need named, and what an envd error means."""

from __future__ import annotations

from typing import NoReturn
from urllib.parse import quote

import httpx

from durable_sandbox.providers.contract import (
    SandboxHandle,
    safe_relative_path,
)
from durable_sandbox.providers.e2b_api import (
    ENVD_PORT,
    SandboxDetail,
    envd_version,
    needs_explicit_user,
    sandbox_url,
)
from durable_sandbox.providers.e2b_snapshots import E2BSnapshots

__all__ = ["ENVD_USER", "HOME", "E2BEnvd"]

ENVD_USER = "user"
HOME = "/home/user"


class E2BEnvd(E2BSnapshots):
    """Where a sandbox's envd answers and with which headers (its token looked up again after a restart)."""

    async def _envd(self, handle: SandboxHandle) -> tuple[str, dict[str, str]]:
        if handle.id not in self._tokens:
            # A handle from an earlier process: the token was never persisted, so ask E2B again.
            op = f"look up sandbox {handle.id}"
            response = await self._request(op, "GET", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}",
                                           headers=self._api_headers())
            if response.status_code != 200:
                self._fail(op, response, sandbox_id=handle.id)
            detail = self._parse(op, response, SandboxDetail)
            self._remember(handle.id, detail.envd_access_token, detail.domain, detail.envd_version)
        # The routing headers go with every envd request, whichever host serves it (as the SDK does).
        headers = {"E2b-Sandbox-Id": handle.id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        token = self._tokens[handle.id]
        if token:
            headers["X-Access-Token"] = token
        domain = self._domains.get(handle.id) or handle.metadata.get("domain") or self.domain
        return sandbox_url(handle.id, domain, self.sandbox_url), headers

    def _explicit_user(self, handle: SandboxHandle) -> bool:
        """Whether envd needs the user named (envd < 0.4.0 has no default user)."""
        version = self._envd_versions.get(handle.id) or envd_version(handle.metadata.get("envdVersion"))
        return needs_explicit_user(version)

    def _files_params(self, handle: SandboxHandle, path: str) -> dict[str, str]:
        params = {"path": safe_relative_path(path)}
        if self._explicit_user(handle):
            params["username"] = ENVD_USER
        return params

    def _envd_fail(self, op: str, response: httpx.Response, handle: SandboxHandle) -> NoReturn:
        if response.status_code == 401:
            self._tokens.pop(handle.id, None)  # a stale token is looked up again next time
        self._fail(op, response, sandbox_id=handle.id)

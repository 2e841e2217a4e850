"""The e2b provider's sandboxes: create (an Idempotency-Key per operation, so a create whose answer was lost
is answered with the same sandbox), restore from a snapshot, leases, destroy, and the listings by owner and
installation (running and paused, every page)."""

from __future__ import annotations

import logging
import secrets
from typing import Any
from urllib.parse import quote

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProviderError,
    ProvisionError,
    SandboxHandle,
    SandboxSpec,
)
from durable_sandbox.providers.e2b_api import (
    CreatedSandbox,
    ListedSandbox,
    envd_version,
    idempotency_key,
    metadata_query,
)
from durable_sandbox.providers.e2b_http import E2BConnection

log = logging.getLogger("durable_sandbox.providers.e2b")

__all__ = ["MAXIMUM_LEASE_SECONDS", "OWNER_METADATA_KEY", "E2BSandboxes"]

MAXIMUM_LEASE_SECONDS = 86_400
OWNER_METADATA_KEY = "durable-sandbox.dev/owner"


class E2BSandboxes(E2BConnection):
    """Sandboxes over their lives: create (idempotent per operation), restore, leases, destroy, listings."""

    def _check_lease(self, seconds: int) -> None:
        if not isinstance(seconds, int) or not 1 <= seconds <= MAXIMUM_LEASE_SECONDS:
            raise ValueError(f"lease must be a whole number of seconds in [1, {MAXIMUM_LEASE_SECONDS}], got {seconds!r}")

    def _create_key(self, op: str, spec: SandboxSpec) -> str:
        """The ``Idempotency-Key`` of a create: derived from the spec's operation id (a retry of the same
        operation is answered with the same sandbox), or fresh for a caller that gave none (then only this
        call's own retries share it)."""
        if spec.operation_id is None:
            return idempotency_key(self._instance, op, secrets.token_hex(8))
        generation = self._key_generation.get(spec.operation_id, 0)
        return idempotency_key(self._instance, spec.operation_id, str(generation))

    async def _create(self, op: str, template: str, spec: SandboxSpec, lease_seconds: int) -> SandboxHandle:
        self._check_lease(lease_seconds)
        metadata = dict(spec.labels)
        if spec.owner is not None:
            metadata[OWNER_METADATA_KEY] = spec.owner
        body: dict[str, Any] = {"templateID": template, "timeout": lease_seconds, "metadata": metadata,
                                "envVars": dict(spec.env)}
        # With the key, E2B answers a repeated create with the sandbox of the first one, so a create whose
        # answer was lost is safe to send again: exactly one sandbox.
        headers = {**self._api_headers(), "Idempotency-Key": self._create_key(op, spec)}
        response = await self._request(op, "POST", f"{self.api_url}/v2/sandboxes", provisioning=True,
                                       json=body, headers=headers)
        if response.status_code != 201:
            self._fail(op, response, provisioning=True)
        try:
            created = self._parse(op, response, CreatedSandbox)
        except ProviderError as exc:
            raise ProvisionError(str(exc), retryable=True) from None
        sandbox_id = created.sandbox_id
        self._remember(sandbox_id, created.envd_access_token, created.domain, created.envd_version)
        if spec.operation_id is not None:
            self._created_by[sandbox_id] = spec.operation_id
        meta: dict[str, Any] = {"templateID": template, "envdVersion": created.envd_version}
        if created.domain:
            meta["domain"] = created.domain
        if spec.owner is not None:
            meta["owner"] = spec.owner
        if spec.labels:
            meta["labels"] = dict(spec.labels)
        log.debug("e2b created sandbox %s from template %s", sandbox_id, template)
        return SandboxHandle(id=sandbox_id, provider=self.name, metadata=meta,
                             lease_expires_at=self._clock() + lease_seconds)

    def _remember(self, sandbox_id: str, token: str | None, domain: str | None, version: str | None) -> None:
        self._tokens[sandbox_id] = token or None
        if domain:
            self._domains[sandbox_id] = domain
        self._envd_versions[sandbox_id] = envd_version(version)

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        return await self._create("create sandbox", spec.template or self.template, spec, lease_seconds)

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        op = f"restore snapshot {snapshot_id}"
        try:
            return await self._create(op, snapshot_id, spec, lease_seconds)
        except ProvisionError as exc:
            if "answered 404" in str(exc):
                raise ProvisionError(f"{op}: the snapshot does not exist (deleted?)", retryable=False) from None
            raise

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        self._check_lease(seconds)
        op = f"renew lease of sandbox {handle.id}"
        response = await self._request(op, "POST", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}/timeout",
                                       json={"timeout": seconds}, headers=self._api_headers())
        if response.status_code != 204:
            self._fail(op, response, sandbox_id=handle.id)
        return handle.model_copy(update={"lease_expires_at": self._clock() + seconds})

    async def destroy(self, handle: SandboxHandle) -> None:
        op = f"destroy sandbox {handle.id}"
        response = await self._request(op, "DELETE", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}",
                                       headers=self._api_headers())
        if response.status_code not in (204, 404):  # 404: already gone, which is what destroy wants
            self._fail(op, response)
        self._tokens.pop(handle.id, None)
        self._domains.pop(handle.id, None)
        self._envd_versions.pop(handle.id, None)
        operation = self._created_by.pop(handle.id, None)
        if operation is not None:
            # A later create for the same operation (after this sandbox was reaped) must get a new sandbox,
            # not E2B's remembered answer pointing at the one just destroyed.
            self._key_generation[operation] = self._key_generation.get(operation, 0) + 1

    async def _listed(self, op: str, key: str, value: str) -> list[SandboxHandle]:
        """Every sandbox whose metadata has ``key: value``, running or paused, across all pages (``GET
        /v2/sandboxes``; the v1 listing shows running sandboxes only, so an orphan sweep on it would miss paused
        ones). Filtered again here: a server that ignored the filter must not make a sweep destroy foreign ones."""
        params = {"metadata": metadata_query({key: value}), "state": "running,paused"}
        handles = []
        async for response in self._pages(op, "/v2/sandboxes", params):
            for item in self._parse_list(op, response, ListedSandbox):
                metadata = item.metadata or {}
                if metadata.get(key) != value:
                    continue
                handles.append(SandboxHandle(
                    id=item.sandbox_id, provider=self.name,
                    metadata={"templateID": item.template_id, "owner": metadata.get(OWNER_METADATA_KEY),
                              "state": item.state,
                              "labels": {k: v for k, v in metadata.items() if k != OWNER_METADATA_KEY}},
                    lease_expires_at=item.end_at.timestamp(),
                ))
        return handles

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        """Every sandbox tagged with ``owner``, running or paused, across all pages."""
        return await self._listed(f"list sandboxes of owner {owner}", OWNER_METADATA_KEY, owner)

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        """Every sandbox labelled with ``installation``, running or paused, whatever its owner, on every page."""
        return await self._listed(f"list sandboxes of installation {installation}", INSTALLATION_LABEL, installation)

"""The e2b provider's snapshots: named from the operation (a retry finds the first one instead of taking
another), tagged in the name with the sandbox's installation and owner digests (E2B keeps nothing else with a
snapshot), deleted, and listed for the orphan sweep."""

from __future__ import annotations

import hashlib
import logging
import re
from urllib.parse import quote

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    ProviderError,
    SandboxHandle,
    SnapshotEntry,
    tag_key,
)
from durable_sandbox.providers.e2b_api import (
    SnapshotInfo,
    bare_snapshot_name,
)
from durable_sandbox.providers.e2b_http import Transient
from durable_sandbox.providers.e2b_sandboxes import E2BSandboxes

log = logging.getLogger("durable_sandbox.providers.e2b")

__all__ = ["SNAPSHOT_NAME_PREFIX", "E2BSnapshots", "parse_tagged_snapshot_name", "snapshot_name"]

SNAPSHOT_NAME_PREFIX = "dsb-"


def snapshot_name(operation_id: str, handle: SandboxHandle | None = None) -> str:
    """The snapshot name for an operation: deterministic, so a retried snapshot finds the first one.

    E2B keeps nothing but a name with a snapshot, so a snapshot of a sandbox labelled with an installation
    carries its tags in the name, as digests (``tag_key``): ``dsb-<installation>-<owner>-<k|d><operation>``
    (``k``: the sandbox had RETAIN_LABEL). The inventory reads them back (:func:`parse_tagged_snapshot_name`)."""
    digest = hashlib.sha256(operation_id.encode()).hexdigest()
    labels = (handle.metadata.get("labels") if handle is not None else None) or {}
    installation = labels.get(INSTALLATION_LABEL) if isinstance(labels, dict) else None
    if not isinstance(installation, str):
        return SNAPSHOT_NAME_PREFIX + digest[:40]
    assert handle is not None
    owner = handle.metadata.get("owner")
    owner_key = tag_key(owner) if isinstance(owner, str) else _NO_OWNER
    kept = "k" if RETAIN_LABEL in labels else "d"
    return f"{SNAPSHOT_NAME_PREFIX}{tag_key(installation)}-{owner_key}-{kept}{digest[:28]}"


_NO_OWNER = "0" * 12
_TAGGED_NAME = re.compile(rf"{SNAPSHOT_NAME_PREFIX}([0-9a-f]{{12}})-([0-9a-f]{{12}})-([kd])[0-9a-f]{{28}}")


def parse_tagged_snapshot_name(name: str) -> tuple[str, str | None, bool] | None:
    """``(installation key, owner key or None, retained)`` of a name made by :func:`snapshot_name` for a
    labelled sandbox; None for any other name."""
    match = _TAGGED_NAME.fullmatch(name)
    if match is None:
        return None
    installation_key, owner_key, kept = match.groups()
    return installation_key, (None if owner_key == _NO_OWNER else owner_key), kept == "k"




class E2BSnapshots(E2BSandboxes):
    """Snapshots by name (a retried one finds the first), their deletion and their inventory."""

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        """Every snapshot whose name carries ``installation``'s key (see :func:`snapshot_name`), on every page
        of ``GET /snapshots``."""
        op = f"list snapshots of installation {installation}"
        key = tag_key(installation)
        entries: dict[str, SnapshotEntry] = {}
        async for response in self._pages(op, "/snapshots", {}):
            for item in self._parse_list(op, response, SnapshotInfo):
                for full in item.names:
                    tags = parse_tagged_snapshot_name(bare_snapshot_name(full))
                    if tags is not None and tags[0] == key:
                        entries[item.snapshot_id] = SnapshotEntry(
                            id=item.snapshot_id, provider=self.name, installation_key=key, owner_key=tags[1],
                            retained=tags[2],
                        )
        return list(entries.values())

    # ------------------------------------------------------------------------------------- snapshots

    async def _find_snapshot(self, op: str, name: str) -> str | None:
        """The snapshot named ``name``, looked for on every page. E2B reports full names
        (``team-slug/<name>:<tag>``), so the namespace and tag are set aside before comparing."""
        async for response in self._pages(op, "/snapshots", {"name": name}):
            for item in self._parse_list(op, response, SnapshotInfo):
                if any(bare_snapshot_name(full) == name for full in item.names):
                    return item.snapshot_id
        return None

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        name = snapshot_name(operation_id, handle)
        op = f"snapshot sandbox {handle.id} (operation {operation_id})"
        attempt = 0
        # Look up before creating, on every attempt: when a response was lost after E2B persisted the
        # snapshot, the retry finds it instead of building a second one over the same name.
        while True:
            try:
                existing = await self._find_snapshot(op, name)
                if existing is not None:
                    return existing
                response = await self._send_once(
                    op, "POST", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}/snapshots",
                    replay_safe=True, json={"name": name}, headers=self._api_headers(),
                )
            except Transient as failure:
                if not await self._backoff(attempt, failure):
                    raise ProviderError(f"{failure.detail} (gave up after {attempt + 1} attempt(s))") from None
                attempt += 1
                continue
            if response.status_code != 201:
                self._fail(op, response, sandbox_id=handle.id)
            snapshot_id = self._parse(op, response, SnapshotInfo).snapshot_id
            log.debug("e2b snapshot %s taken of sandbox %s", snapshot_id, handle.id)
            return snapshot_id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        op = f"delete snapshot {snapshot_id}"
        response = await self._request(op, "DELETE", f"{self.api_url}/templates/{quote(snapshot_id, safe='')}",
                                        headers=self._api_headers())
        if response.status_code not in (204, 404):  # 404: already deleted
            self._fail(op, response)

    # ------------------------------------------------------------------------------------- envd

"""E2B's management API and envd addressing as E2B's own SDK speaks them (``e2b`` on PyPI, checked at 2.63.0).

The pieces of the protocol that are easy to get subtly wrong live here, each written after the SDK's source:
the response models (the fields the SDK requires), the ``metadata`` query encoding of ``GET /v2/sandboxes``,
snapshot full names, the sandbox URL rule, envd version gates and the create ``Idempotency-Key`` format.
``tests/contract/test_e2b_sdk_conformance.py`` drives the SDK against the fake server and
``tests/contract/test_e2b_sdk_request_shapes.py`` compares its requests with ours, so drift shows up as a failure.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Literal
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ConfigDict, Field

ENVD_PORT = 49983
DEFAULT_DOMAIN = "e2b.app"
# Domains served by E2B's shared sandbox edge (the SDK's ``SUPPORTED_SANDBOX_DOMAINS``): envd is reached at
# ``https://sandbox.<domain>`` and routed by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers. Any other
# domain (self-hosted, BYOC) serves each sandbox at ``https://49983-<id>.<domain>``.
SHARED_SANDBOX_DOMAINS = frozenset(
    {"e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev", "e2b-juliett.dev", "foxtrot-2.e2b.dev"}
)
# envd 0.4.0 gained a default user: before it, every call must name the user (``username=`` on /files,
# ``Authorization: Basic`` on RPCs), which is what the SDK does too.
ENVD_DEFAULT_USER = (0, 4, 0)
_IDEMPOTENCY_KEY = re.compile(r"[a-z0-9-]{1,255}")


class _Model(BaseModel):
    # E2B adds response fields over time; the SDK ignores unknown ones and so do we.
    model_config = ConfigDict(extra="ignore", frozen=True)


class CreatedSandbox(_Model):
    """``Sandbox``: the answer to ``POST /v2/sandboxes`` and ``POST /v2/sandboxes/{id}/connect``."""

    sandbox_id: str = Field(alias="sandboxID", min_length=1)
    template_id: str = Field(alias="templateID")
    envd_version: str = Field(alias="envdVersion")
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    domain: str | None = None


class ListedSandbox(_Model):
    """``ListedSandbox``: one entry of ``GET /v2/sandboxes`` (never carries the access token)."""

    sandbox_id: str = Field(alias="sandboxID", min_length=1)
    template_id: str = Field(alias="templateID")
    state: Literal["running", "paused"]
    end_at: dt.datetime = Field(alias="endAt")
    envd_version: str = Field(alias="envdVersion")
    metadata: dict[str, str] | None = None


class SandboxDetail(ListedSandbox):
    """``SandboxDetail``: ``GET /sandboxes/{id}``."""

    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    domain: str | None = None


class SnapshotInfo(_Model):
    """``SnapshotInfo``: ``names`` are full names, team namespace and tag included (``team-slug/name:tag``)."""

    snapshot_id: str = Field(alias="snapshotID", min_length=1)
    names: list[str] = Field(default_factory=list)


def metadata_query(metadata: dict[str, str]) -> str:
    """The ``metadata`` query value of ``GET /v2/sandboxes``, encoded as the SDK does: each key and value
    percent-quoted, then the pairs form-encoded (the server decodes both layers)."""
    return urlencode({quote(k): quote(v) for k, v in metadata.items()})


def bare_snapshot_name(full_name: str) -> str:
    """``team-slug/my-snapshot:v2`` -> ``my-snapshot`` (a name without namespace or tag is returned as is)."""
    return full_name.rsplit("/", 1)[-1].split(":", 1)[0]


def envd_version(value: str | None) -> tuple[int, ...] | None:
    """``"0.6.4"`` -> ``(0, 6, 4)``; None when absent or not a release number (then the old-envd path is taken,
    which every envd accepts)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+.].*)?", value or "")
    return tuple(int(part) for part in match.groups()) if match else None


def needs_explicit_user(version: tuple[int, ...] | None) -> bool:
    return version is None or version < ENVD_DEFAULT_USER


def sandbox_url(sandbox_id: str, domain: str, override: str | None) -> str:
    """Where envd is reached; the request always carries the routing headers as well."""
    if override:
        return override
    if domain in SHARED_SANDBOX_DOMAINS:
        return f"https://sandbox.{domain}"
    return f"https://{ENVD_PORT}-{sandbox_id}.{domain}"


def idempotency_key(*parts: str) -> str:
    """A create ``Idempotency-Key`` (1-255 of ``[a-z0-9-]``, as the SDK requires) derived from ``parts``."""
    key = "dsb-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:48]
    assert _IDEMPOTENCY_KEY.fullmatch(key)
    return key

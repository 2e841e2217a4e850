"""The ``e2b`` provider: E2B sandboxes over E2B's HTTP APIs (management API + envd), as E2B's SDK speaks them.

Configuration (constructor arguments win over the environment): ``E2B_API_KEY`` (required),
``E2B_DOMAIN`` (default ``e2b.app``), ``E2B_API_URL`` (default ``https://api.<domain>``), ``E2B_SANDBOX_URL``
(one envd host for every sandbox; by default ``https://sandbox.<domain>`` for E2B's own domains and
``https://49983-<id>.<domain>`` for others, see :func:`e2b_api.sandbox_url`), ``template`` and the HTTP ``timeout``
(``E2B_REQUEST_TIMEOUT``, seconds, default 30), and the requests sent for a transient failure
(``E2B_RETRY_ATTEMPTS``, default 5).

Secrets (the API key and each sandbox's envd access token) live only in this object's memory: they are
never put in handles, log lines or exception messages, and :meth:`_redact` scrubs them from any text the
server echoes back.

The code, one job per module, each a layer of the class: ``e2b_http.py`` (settings, the HTTP client, retries,
errors, parsing), ``e2b_sandboxes.py`` (create, restore, leases, destroy, listings), ``e2b_snapshots.py``
(snapshots, their names and inventory), ``e2b_envd.py`` (addressing a sandbox's envd), ``e2b_calls.py`` (files
and processes); ``e2b_api.py`` (E2B's answers as models) and ``e2b_connect.py`` (the Connect stream); this
module: configuration and capabilities.
"""

from __future__ import annotations

from collections.abc import Mapping

from durable_sandbox.providers.contract import TOOL_TYPES, Capability, ProviderCapabilities
from durable_sandbox.providers.e2b_api import DEFAULT_DOMAIN
from durable_sandbox.providers.e2b_calls import KEEPALIVE_PING_SECONDS, TIMEOUT_EXIT_CODE, E2BCalls
from durable_sandbox.providers.e2b_envd import ENVD_USER, HOME
from durable_sandbox.providers.e2b_http import (
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TEMPLATE,
    RetryPolicy,
    configuration_problems,
)
from durable_sandbox.providers.e2b_sandboxes import MAXIMUM_LEASE_SECONDS, OWNER_METADATA_KEY
from durable_sandbox.providers.e2b_snapshots import (
    SNAPSHOT_NAME_PREFIX,
    parse_tagged_snapshot_name,
    snapshot_name,
)

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "DEFAULT_TEMPLATE", "ENVD_USER", "HOME", "KEEPALIVE_PING_SECONDS",
           "MAXIMUM_LEASE_SECONDS", "OWNER_METADATA_KEY", "SNAPSHOT_NAME_PREFIX", "TIMEOUT_EXIT_CODE", "E2BProvider",
           "RetryPolicy", "parse_tagged_snapshot_name", "snapshot_name"]


class E2BProvider(E2BCalls):
    """The provider: each layer below adds one job (see the module docstring for where things are)."""

    name = "e2b"

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        domain = environ.get("E2B_DOMAIN") or DEFAULT_DOMAIN
        return configuration_problems(environ.get("E2B_API_KEY"), environ.get("E2B_API_URL") or f"https://api.{domain}",
                                      environ.get("E2B_SANDBOX_URL") or None, environ.get("E2B_REQUEST_TIMEOUT"),
                                      environ.get("E2B_RETRY_ATTEMPTS"))

    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(
            supported=frozenset(
                {
                    Capability.SNAPSHOT,
                    Capability.SNAPSHOT_DELETION,
                    Capability.SNAPSHOT_RECONCILIATION,
                    Capability.RESTORE,
                    Capability.LEASE_RECONCILIATION,
                    Capability.INVENTORY,
                }
            ),
            delivery_guarantee="at_least_once_effects",
            idempotent_destroy=True,
            maximum_lease_seconds=MAXIMUM_LEASE_SECONDS,
            tool_types=TOOL_TYPES,
        )

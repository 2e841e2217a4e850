"""The ``local`` sandbox provider (development only; ``provider.py`` says what it is and is not). The names
others import are re-exported here."""

from durable_sandbox.providers.local.layout import LocalDirectories, default_home, snapshot_id_for
from durable_sandbox.providers.local.provider import LocalProvider, SandboxSuspendedError

__all__ = [
    "LocalDirectories",
    "LocalProvider",
    "SandboxSuspendedError",
    "default_home",
    "snapshot_id_for",
]

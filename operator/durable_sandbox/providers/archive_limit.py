"""How big a snapshot's archive may be, on the way to the store and on the way back into a sandbox.

Code in a sandbox decides what its workspace holds: a sparse file (``truncate -s 2G f``) takes no disk, but a tar
that cannot keep it sparse writes every byte of it, so each snapshot would upload 2 GiB and a restore would write
them onto the node's disk. A provider counts every archive's bytes (or its files' sizes, before their bytes) with
:class:`ArchiveBudget` and stops at its limit with :class:`ArchiveTooLarge`: the snapshot fails, saying the limit
and what to do; nothing past the limit is uploaded or written; the provider and the operator go on. A restore
refuses an archive over the limit before it makes a sandbox.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from durable_sandbox.providers.contract import ConfigurationError, ProvisionError

__all__ = ["ArchiveBudget", "ArchiveTooLarge", "configured_limit", "format_size", "quantity_bytes"]

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_FACTORS: Final[Mapping[str | None, int]] = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


class ArchiveTooLarge(ProvisionError):
    """A snapshot's archive is over the provider's limit. Final: taking it again makes the same archive."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        super().__init__(
            f"{what}: the workspace's archive is larger than the limit of {format_size(limit)} ({setting}); "
            f"nothing past the limit was stored or written. Make the workspace smaller (a sparse file counts at "
            f"its full size where tar cannot keep it sparse), or raise {setting}", retryable=False)
        self.limit = limit


def quantity_bytes(text: str, setting: str) -> int:
    """A Kubernetes quantity of bytes (``1Gi``, ``500M``, ``1073741824``) as an int; a ConfigurationError naming
    ``setting`` otherwise."""
    match = _QUANTITY.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ConfigurationError(f"{setting} must be a positive size such as 1Gi or 500Mi, got {text!r}")
    return int(float(match.group(1)) * _FACTORS[match.group(2)])


def configured_limit(environ: Mapping[str, str], key: str, default: str, default_setting: str) -> int:
    """The limit setting ``key`` holds, else ``default`` (a quantity: what ``default_setting`` says)."""
    raw = environ.get(key)
    return quantity_bytes(raw, key) if raw else quantity_bytes(default, default_setting)


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"


class ArchiveBudget:
    """Bytes counted against the limit as an archive is made or read; :meth:`spend` raises once they pass it."""

    def __init__(self, limit: int, what: str, setting: str) -> None:
        self.limit, self.what, self.setting = limit, what, setting
        self.spent = 0

    def spend(self, size: int) -> None:
        self.spent += size
        if self.spent > self.limit:
            raise ArchiveTooLarge(self.what, self.limit, self.setting)

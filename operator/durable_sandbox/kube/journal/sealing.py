"""Authenticated journal values: what the operator wrote can be told from what anyone else wrote.

The journal lives in objects of the project's own kind (``Journal``), which namespace roles do not grant, so a
namespace user cannot write it at all. Someone with broader rights can (a cluster administrator, a controller
with a wildcard role); a run must still never execute, believe or delete on the word of such an edit. So every
value the operator acts on is *sealed*: prefixed with an HMAC-SHA256 (truncated to 128 bits) under a key only
the operator holds (``kube/journal/journal_key.py``), over the namespace, the object's scope (the run key, or the name
of a thread-state or cache object), the data key and the value. A value moved to another run, another
namespace or another key, or changed at all, fails to open; so does a value without a seal when a key is set.

What a seal does not stop: putting back an older value the operator itself wrote under the same key (a
rollback, e.g. a run's status). Every such value was once true of this run, so the worst outcome is that the
run replays from its journal again; records themselves cannot be rolled back (each seq is written once).

Sealed form: ``~`` + 22 characters of unpadded base64url MAC + the value. JSON text never starts with ``~``
and a blob reference starts with ``@``, so a reader without the key (``dsb --kube``, which only reads) strips
a seal without ambiguity. ``fence`` and ``seq`` are not sealed: JSON Patch ``test`` ops compare them, and a
forged value of either only makes the holder's next commit fail (it reloads) or a load find records missing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from durable_sandbox.engine.errors import JournalDamaged

__all__ = ["Sealer"]

MARK = "~"
_MAC_CHARS = 22  # 16 bytes, base64url without padding


class Sealer:
    """Seals and opens the values of one namespace's journal objects (no key: values are stored as they are,
    and seals found on reading are stripped unchecked)."""

    def __init__(self, key: bytes | None, namespace: str) -> None:
        self.key = key
        self._prefix = namespace.encode() + b"\0"

    @property
    def verifies(self) -> bool:
        return self.key is not None

    def _mac(self, scope: str, name: str, value: str) -> str:
        assert self.key is not None
        msg = b"".join((self._prefix, scope.encode(), b"\0", name.encode(), b"\0", value.encode()))
        digest = hmac.new(self.key, msg, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def seal(self, scope: str, name: str, value: str) -> str:
        if self.key is None:
            return value
        return MARK + self._mac(scope, name, value) + value

    def open(self, scope: str, name: str, stored: str, *, run_id: str, where: str) -> str:
        """The value of a sealed ``stored`` text; :class:`JournalDamaged` (tampered) when it does not verify."""
        sealed = stored.startswith(MARK) and len(stored) > _MAC_CHARS
        value = stored[1 + _MAC_CHARS:] if sealed else stored
        if self.key is None:
            return value
        if not sealed:
            raise JournalDamaged(run_id, f"{where} key {name!r}", "the value carries no seal", tampered=True)
        if not hmac.compare_digest(stored[1:1 + _MAC_CHARS], self._mac(scope, name, value)):
            raise JournalDamaged(run_id, f"{where} key {name!r}", "the value's seal does not match it",
                                 tampered=True)
        return value

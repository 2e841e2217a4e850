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

**Per-namespace keys.** Values are sealed with the *namespace key* of their namespace,
``HMAC-SHA256(journal key, "durable-sandbox.dev/namespace-key" NUL namespace)`` (:func:`namespace_key`), never with
the journal key itself. The operator derives every namespace's key from its journal key; a worker of namespace
A (``dsb worker --kube``, spec.worker) is handed only A's key (a Secret in A, ``kube/journal/worker_key.py``), so
it can seal A's values and nothing it seals opens in namespace B, whose values the operator checks only with
B's key. Values sealed with the journal key itself before namespace keys existed still open (a run in flight
across the upgrade goes on); only the operator, which holds the journal key, can make such a seal.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from durable_sandbox.engine.errors import JournalDamaged

__all__ = ["NAMESPACE_KEY_CONTEXT", "Sealer", "namespace_key"]

MARK = "~"
_MAC_CHARS = 22  # 16 bytes, base64url without padding
NAMESPACE_KEY_CONTEXT = b"durable-sandbox.dev/namespace-key\0"


def namespace_key(journal_key: bytes, namespace: str) -> bytes:
    """The key that seals ``namespace``'s journal values: derived from the journal key, one way (holding one
    namespace's key tells nothing of the journal key or of another namespace's)."""
    return hmac.new(journal_key, NAMESPACE_KEY_CONTEXT + namespace.encode(), hashlib.sha256).digest()


_derive = namespace_key  # Sealer's parameter of that name shadows it


class Sealer:
    """Seals and opens the values of one namespace's journal objects (no key: values are stored as they are,
    and seals found on reading are stripped unchecked).

    ``key`` is the journal key (the operator's: the namespace key is derived from it, and values sealed with the
    journal key itself still open), or with ``namespace_key=True`` the namespace key alone (a worker's: it
    seals and opens this namespace's values only)."""

    def __init__(self, key: bytes | None, namespace: str, *, namespace_key: bool = False) -> None:
        self.key: bytes | None = None if key is None else key if namespace_key else _derive(key, namespace)
        self._legacy = None if key is None or namespace_key else key
        self._prefix = namespace.encode() + b"\0"

    @property
    def verifies(self) -> bool:
        return self.key is not None

    def _mac(self, scope: str, name: str, value: str, key: bytes | None = None) -> str:
        key = key if key is not None else self.key
        assert key is not None
        msg = b"".join((self._prefix, scope.encode(), b"\0", name.encode(), b"\0", value.encode()))
        digest = hmac.new(key, msg, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def seal(self, scope: str, name: str, value: str) -> str:
        if self.key is None:
            return value
        return MARK + self._mac(scope, name, value) + value

    def _matches(self, mac: str, scope: str, name: str, value: str) -> bool:
        if hmac.compare_digest(mac, self._mac(scope, name, value)):
            return True
        return self._legacy is not None and hmac.compare_digest(mac, self._mac(scope, name, value, self._legacy))

    def open(self, scope: str, name: str, stored: str, *, run_id: str, where: str) -> str:
        """The value of a sealed ``stored`` text; :class:`JournalDamaged` (tampered) when it does not verify."""
        sealed = stored.startswith(MARK) and len(stored) > _MAC_CHARS
        value = stored[1 + _MAC_CHARS:] if sealed else stored
        if self.key is None:
            return value
        if not sealed:
            raise JournalDamaged(run_id, f"{where} key {name!r}", "the value carries no seal", tampered=True)
        if not self._matches(stored[1:1 + _MAC_CHARS], scope, name, value):
            raise JournalDamaged(run_id, f"{where} key {name!r}", "the value's seal does not match it",
                                 tampered=True)
        return value

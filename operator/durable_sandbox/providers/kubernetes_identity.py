"""Which sandbox Pods are the operator's: told by a seal over the Pod's uid, never by its labels or annotations.

Anyone who may create or patch Pods in a namespace can give a Pod the labels and annotations of a sandbox Pod
(owner, operation, installation: their values are printed on the real Pod), and anyone who may delete Pods can
make a new one under a sandbox Pod's name. So what the kubernetes provider adopts, lists, renews or deletes is
decided by an HMAC seal under a key only the operator holds (derived from its journal key, as the warm pool's:
``providers/kubernetes_pool.py``), in annotation ``durable-sandbox.dev/seal``:

* ``c.<mac>`` *creation mark*, in the manifest the Pod is created with: over namespace, name, the owner's and
  the operation's keys and the description annotation (owner, labels, template). It cannot know the uid (the API
  server assigns it), so it says only "the operator asked for a Pod of this name for this operation": a Pod
  carrying only this mark is an attempt that never finished (or a copy of one), which a retry of the same
  operation deletes and makes again, and nothing else uses.
* ``s.<mac>`` *seal*, patched on once the Pod is ready, checked and restored: over the same and the Pod's uid.
  Only a sealed Pod is adopted (a retried provision), listed (``list_sandboxes``, the inventory, so the orphan
  sweep) or deleted when its lease ran out. A Pod re-created under the same name has another uid; an edited
  label or description breaks the MAC.

Without the operator's key (the provider used on its own, outside the operator) a key of this process is used:
it trusts only the Pods it made itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["META_ANNOTATION", "SEAL", "Identity", "completion_seal", "creation_mark", "env_secret_name", "identify",
           "identity_key"]

SEAL = "durable-sandbox.dev/seal"
META_ANNOTATION = "durable-sandbox.dev/sandbox"  # JSON: owner, labels, template (the handle's metadata)
OWNER_KEY_LABEL = "durable-sandbox.dev/owner-key"
OPERATION_KEY_LABEL = "durable-sandbox.dev/operation-key"
Verdict = Literal["sealed", "created", "foreign"]
SEALED: Verdict = "sealed"
CREATED: Verdict = "created"
FOREIGN: Verdict = "foreign"


def identity_key(pool_key: bytes | None) -> bytes:
    """The key of sandbox Pod seals: its own purpose under the operator's pool key, else one of this process."""
    base = pool_key if pool_key is not None else secrets.token_bytes(32)
    return hmac.new(base, b"durable-sandbox.dev/sandbox-pod-seal/v1", hashlib.sha256).digest()


def _mac(key: bytes, *parts: str) -> str:
    digest = hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def creation_mark(key: bytes, namespace: str, name: str, owner_key: str, operation_key: str, described: str) -> str:
    return "c." + _mac(key, "sandbox-created", namespace, name, owner_key, operation_key, described)


def completion_seal(key: bytes, namespace: str, name: str, uid: str, owner_key: str, operation_key: str,
                    described: str) -> str:
    return "s." + _mac(key, "sandbox", namespace, name, uid, owner_key, operation_key, described)


def env_secret_name(key: bytes, namespace: str, pod: str) -> str:
    """The name of a sandbox Pod's env Secret: ``<pod>-env-<mac>``, which only the operator can compute, so nobody
    can make a Secret under it beforehand for the sandbox's env values to be written into (or read from). The
    same for every attempt of one operation (a retry finds the Secret an earlier attempt made)."""
    digest = hmac.new(key, "\0".join(("env-secret", namespace, pod)).encode(), hashlib.sha256).hexdigest()
    return f"{pod}-env-{digest[:16]}"


@dataclass(frozen=True, slots=True)
class Identity:
    """What the operator knows of one Pod: ``sealed`` (its finished sandbox Pod, this uid), ``created`` (it asked
    for a Pod of this name and operation, never finished) or ``foreign`` (not its own; ``why`` says how)."""

    verdict: Verdict
    why: str = ""

    @property
    def sealed(self) -> bool:
        return self.verdict == SEALED


def identify(pod: Mapping[str, Any], key: bytes) -> Identity:
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    owner_key, operation_key = labels.get(OWNER_KEY_LABEL, ""), labels.get(OPERATION_KEY_LABEL, "")
    described, seal = annotations.get(META_ANNOTATION, ""), annotations.get(SEAL, "")
    if not seal:
        return Identity(FOREIGN, "it carries no seal of the operator's")
    if hmac.compare_digest(seal, completion_seal(key, namespace, name, uid, owner_key, operation_key, described)):
        return Identity(SEALED)
    if hmac.compare_digest(seal, creation_mark(key, namespace, name, owner_key, operation_key, described)):
        return Identity(CREATED, "it was never finished (no seal over its uid)")
    return Identity(FOREIGN, "its seal does not match it (copied from another Pod, or its uid, labels or "
                             "description annotation are not those the operator sealed)")

"""Warm Pods for the ``kubernetes`` provider: what a pool Pod is, how it is told from a forgery, and the plan
that keeps a pool at its size. No API calls here (the provider claims, ``kube/pool/`` reconciles); all pure.

A pool Pod goes through three states, in its label ``durable-sandbox.dev/pool-state``:

* ``starting``: made by the pool's reconciler from the pool's PodTemplate, exactly as a cold provision makes
  a Pod (``PodTemplate.pod``), with no owner, no env Secret, and owned by its ``SandboxPool`` (ownerReferences:
  the cluster deletes it with the pool). It carries a *creation seal* over namespace, name, pool and template
  hash; that cannot bind the uid (the API server assigns it), so a Pod made again under the same name with the
  seal copied would carry it too: the reconciler promotes only a Pod whose whole spec that matters is the
  template's (``providers/kubernetes_pod_match.py``: image, command, runtime class, security contexts, volumes,
  service account and token, host namespaces, init and ephemeral containers); any other is refused (a log line
  and a Warning Event), never promoted, never deleted, and a replacement is made.
* ``warm``: running, the image checked (the same probe a cold provision runs), and sealed again, now over its
  uid too (a Pod deleted and made again under the same name by someone else has another uid).
* ``claimed``: one provision won it (:func:`claim_patch`: a merge patch carrying the ``resourceVersion`` it
  read, so of two claimers exactly one succeeds and the other gets 409). The patch gives it the provision's
  labels and annotations (owner, lease, operation), takes the warm seal off (a claimed Pod can never be
  claimed again, whatever anyone does to its labels) and drops the pool's ownerReference (it is the session's
  now, deleted by it as a cold Pod is).

Seals are HMAC-SHA256 under the pool key, which the operator derives from its journal key
(``kube/journal/journal_key.py``); whoever may only edit the namespace's Pods can neither mint one nor move one to
another Pod. A claim compares the whole spec with the template's again (Pods let ``image`` be patched, and
ephemeral containers be added), besides the warm seal over the uid.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.providers.kubernetes_pod_match import spec_mismatch
from durable_sandbox.providers.kubernetes_template import PodTemplate

__all__ = [
    "OPERATION_KEY_LABEL", "OWNER_KEY_LABEL", "POOL_LABEL", "POOL_STATE_LABEL", "SEAL_ANNOTATION", "TEMPLATE_HASH_LABEL", "PoolClaim", "PoolPlan", "PoolPod",
    "claim_patch", "creation_seal", "derive_pool_key", "plan_pool", "template_hash", "warm_seal",
]

POOL_LABEL = "durable-sandbox.dev/pool"
POOL_STATE_LABEL = "durable-sandbox.dev/pool-state"
TEMPLATE_HASH_LABEL = "durable-sandbox.dev/template-hash"
SEAL_ANNOTATION = "durable-sandbox.dev/pool-seal"
# The provision's labels (kubernetes.py sets them on every sandbox Pod) that a claimed seal binds: a provision
# retried after a lost answer finds its claimed Pod by the operation's key, so relabelling one claimed Pod to
# another operation or owner must break its seal, or a label edit would hand one run's sandbox to another.
OWNER_KEY_LABEL = "durable-sandbox.dev/owner-key"
OPERATION_KEY_LABEL = "durable-sandbox.dev/operation-key"
STARTING, WARM, CLAIMED = "starting", "warm", "claimed"
_HASH_CHARS = 16


def derive_pool_key(journal_key: bytes) -> bytes:
    """The pool key: its own purpose, so a pool seal is never a journal seal (nor the other way round)."""
    return hmac.new(journal_key, b"durable-sandbox.dev/warm-pool-seal/v1", hashlib.sha256).digest()


def template_hash(template: PodTemplate) -> str:
    """A digest of the Pod the template makes (spec, labels, annotations; not the names): equal hashes make
    equal Pods, so a claim takes a Pod of the template the provision would have used, and a changed template
    (any field) gives new Pods a new hash (the roll)."""
    manifest = template.pod(name="", namespace="", labels={}, annotations={}, env_secret=None)
    text = json.dumps({"spec": manifest["spec"], "labels": manifest["metadata"]["labels"],
                       "annotations": manifest["metadata"]["annotations"]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def _mac(key: bytes, *parts: str) -> str:
    digest = hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def creation_seal(key: bytes, namespace: str, name: str, pool: str, thash: str) -> str:
    return "c." + _mac(key, "created", namespace, name, pool, thash)


def warm_seal(key: bytes, namespace: str, name: str, uid: str, pool: str, thash: str) -> str:
    return "w." + _mac(key, "warm", namespace, name, uid, pool, thash)


def claimed_seal(key: bytes, namespace: str, name: str, uid: str, pool: str, owner_key: str, operation_key: str) -> str:
    return "k." + _mac(key, "claimed", namespace, name, uid, pool, owner_key, operation_key)


@dataclass(frozen=True, slots=True)
class PoolPod:
    """One Pod carrying a pool's label, as the planner and the claimer need it."""

    name: str
    uid: str
    state: str  # starting / warm / claimed / anything a forger wrote
    template_hash: str
    sealed: bool  # its seal is the operator's for its state (forged or tampered Pods are False)
    running: bool  # the container runs and is ready
    ended: bool  # failed, ended, or in a state that will not get better (a replacement is made)
    terminating: bool
    created: str  # creationTimestamp (RFC 3339 sorts as text)
    refusal: str = ""  # why a sealed starting or warm Pod is still not the pool's: its spec is not the template's

    @classmethod
    def of(cls, pod: Mapping[str, Any], key: bytes, pool: str, *, hopeless: frozenset[str] = frozenset(),
           manifest: Mapping[str, Any] | None = None) -> PoolPod:
        """``manifest``: the template's Pod; a starting or warm Pod whose spec differs from it is refused (a Pod
        re-created under a starting Pod's name with its creation seal copied, or one patched since)."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        state, thash = labels.get(POOL_STATE_LABEL, ""), labels.get(TEMPLATE_HASH_LABEL, "")
        seal = (meta.get("annotations") or {}).get(SEAL_ANNOTATION, "")
        expected = {STARTING: creation_seal(key, namespace, name, pool, thash),
                    WARM: warm_seal(key, namespace, name, uid, pool, thash),
                    CLAIMED: claimed_seal(key, namespace, name, uid, pool, labels.get(OWNER_KEY_LABEL, ""),
                                          labels.get(OPERATION_KEY_LABEL, ""))}.get(state)
        sealed = expected is not None and hmac.compare_digest(seal, expected)
        status = pod.get("status") or {}
        running = ended = False
        for cs in status.get("containerStatuses") or []:
            st = cs.get("state") or {}
            running = "running" in st and cs.get("ready", True) is not False
            ended = ended or "terminated" in st or (st.get("waiting") or {}).get("reason") in hopeless
        ended = ended or status.get("phase") in ("Failed", "Succeeded")
        refusal = ""
        if sealed and manifest is not None and state in (STARTING, WARM):
            refusal = spec_mismatch(pod, manifest) or ""
        return cls(name=name, uid=uid, state=state, template_hash=thash, sealed=sealed, running=running and not ended,
                   ended=ended, terminating=bool(meta.get("deletionTimestamp")),
                   created=str(meta.get("creationTimestamp") or ""), refusal=refusal)


@dataclass(slots=True)
class PoolPlan:
    """What one reconcile does: ``create`` new Pods, ``promote`` (probe and seal warm) running starters,
    ``delete`` these (only Pods the operator made: sealed), and the counts the status shows."""

    create: int = 0
    promote: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    ready: int = 0
    starting: int = 0
    claimed: int = 0
    ignored: list[str] = field(default_factory=list)  # pool-labelled Pods without the seal, or not the template's
    uids: dict[str, str] = field(default_factory=dict)  # name -> uid of the Pods planned on (deleted by their uid)

    @property
    def total(self) -> int:
        return self.ready + self.starting + self.claimed


def plan_pool(pods: Sequence[PoolPod], *, size: int, thash: str) -> PoolPlan:
    """Keep ``size`` warm-or-starting Pods of template hash ``thash``.

    Pods of another hash (the template changed) are deleted at once: no claim would take them (a claim asks for
    the hash of the template as it is now). Ended Pods are deleted and replaced. Past ``size``, the youngest
    starters go first, then the youngest warm Pods (the oldest have waited longest: keep what is ready). Pods
    without the operator's seal are never counted, promoted or deleted: they are not the pool's (see the module
    docstring), only reported."""
    plan = PoolPlan()
    current: list[PoolPod] = []
    for pod in pods:
        if pod.terminating:
            continue
        if not pod.sealed or pod.refusal:
            plan.ignored.append(pod.name)
            continue
        plan.uids[pod.name] = pod.uid
        if pod.state == CLAIMED:
            plan.claimed += 1
        elif pod.ended or pod.template_hash != thash:
            plan.delete.append(pod.name)
        else:
            current.append(pod)
    # Warm first, then starters; oldest first within each: the ones kept are the first `size`.
    current.sort(key=lambda p: (p.state != WARM, p.created, p.name))
    keep, extra = current[:size], current[size:]
    plan.delete.extend(p.name for p in extra)
    for pod in keep:
        if pod.state == WARM:
            plan.ready += 1
        else:
            plan.starting += 1
            if pod.running:
                plan.promote.append(pod.name)
    plan.create = max(0, size - len(keep))
    return plan


def claim_patch(pod: Mapping[str, Any], *, key: bytes, pool: str, labels: Mapping[str, str],
                annotations: Mapping[str, str]) -> dict[str, Any]:
    """The merge patch that claims ``pod`` for one provision: conditional on the resourceVersion read (409 for
    every claimer but the first), the provision's labels and annotations, the claimed seal instead of the warm
    one, and no ownerReference to the pool any more."""
    meta = pod["metadata"]
    return {"metadata": {
        "resourceVersion": meta["resourceVersion"],
        "labels": {**labels, POOL_STATE_LABEL: CLAIMED},
        "annotations": {**annotations,
                        SEAL_ANNOTATION: claimed_seal(key, meta["namespace"], meta["name"], meta["uid"], pool,
                                                      labels.get(OWNER_KEY_LABEL, ""),
                                                      labels.get(OPERATION_KEY_LABEL, ""))},
        "ownerReferences": None,
    }}


@dataclass(frozen=True, slots=True)
class PoolClaim:
    """What one provision did with the pool (for metrics): ``claimed`` a warm Pod, or a ``miss`` and why."""

    namespace: str
    pool: str  # the pool whose Pod was claimed; on a miss, the template's name
    outcome: str  # claimed / miss
    reason: str  # empty / no-pool-key / env / not-a-podtemplate / none-ready / contended
    seconds: float

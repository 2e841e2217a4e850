"""The journal in the API server: ``KubernetesStore`` (``kubernetes_store.py``) and its parts, one job a module:
``codec`` (names, encodings), ``blobs`` (large values), ``heads`` (a run's head as known, sealed values),
``runs``, ``commits`` (one fenced patch), ``chunks`` (tail sealing, reading the journal), ``side_objects``
(thread state, cache, redo), ``claims`` (leases and fences), ``signals``, ``events`` (the event feed) and
``refusals`` (what API failures become). The names others import are re-exported here."""

from durable_sandbox.kube.store.codec import (
    CHUNK_BYTES,
    LABEL_STATUS,
    TAIL_BYTES,
    OwnerRef,
    run_key,
)
from durable_sandbox.kube.store.kubernetes_store import KubernetesStore

__all__ = ["CHUNK_BYTES", "LABEL_STATUS", "TAIL_BYTES", "KubernetesStore", "OwnerRef", "run_key"]

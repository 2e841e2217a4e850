"""KubernetesStore's pure parts: object names from run ids, the record encoding, JSON Pointer escaping.
(The store itself runs the contract kit against the real control plane: tests/e2e.)"""

from __future__ import annotations

import re

from durable_sandbox.engine.records import ErrorInfo, OperationRecord
from durable_sandbox.kube.store.codec import decode_record, encode_record, jp, run_key

_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def test_run_key_is_the_id_when_it_is_a_dns_label_else_a_stable_digest() -> None:
    assert run_key("hello-1a2b3c4d") == "hello-1a2b3c4d"
    odd = ["Upper", "with/slash", "x" * 64, "under_score", "-lead", "ends-"]
    keys = [run_key(r) for r in odd]
    assert len(set(keys)) == len(odd) and keys == [run_key(r) for r in odd]
    for k in keys:
        assert len(k) <= 63 and _OBJECT_NAME.fullmatch(k), k


def test_records_round_trip_through_the_encoding() -> None:
    rec = OperationRecord("op/1", "sandbox.call", "shell", "completed", 2, "sha", {"stdout": "é"},
                          ErrorInfo("E", "m", True, {"k": 1}), {"m": 1}, 12.5, 3)
    back = decode_record(7, encode_record(rec))
    assert back == OperationRecord("op/1", "sandbox.call", "shell", "completed", 2, "sha", {"stdout": "é"},
                                   ErrorInfo("E", "m", True, {"k": 1}), {"m": 1}, 12.5, 3, seq=7)
    started = decode_record(1, encode_record(OperationRecord("a", "step", "f", "started", result="x")))
    assert started.result is None and started.error is None and started.epoch == 0


def test_json_pointer_escapes_slash_and_tilde() -> None:
    assert jp("metadata", "labels", "durable-sandbox.dev/status") == "/metadata/labels/durable-sandbox.dev~1status"
    assert jp("data", "a~b") == "/data/a~0b"

"""kopf's diff-base (status.kopf.diffbase) keeps only the steering fields of a Workflow's spec, so a
10,000-call program does not end up a second time in status, past its 64 KiB budget."""

from __future__ import annotations

import json

import kopf

from durable_sandbox.kube.handlers import DIFFBASE_SPEC_FIELDS, SteeringDiffBase, _digest


def test_the_diffbase_of_a_10000_call_workflow_stays_small() -> None:
    calls = [{"type": "write_file", "path": f"f{i}.txt", "contents": "x" * 40} for i in range(10_000)]
    spec = {"toolCalls": calls, "sandbox": {"provider": "local"}, "suspend": True, "signals": {"ok": [1]},
            "cancel": False}  # fmt: skip
    body = kopf.Body({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                      "metadata": {"name": "big", "namespace": "ns", "labels": {"a": "b"}}, "spec": spec})  # fmt: skip
    storage = SteeringDiffBase(field="status.kopf.diffbase")
    essence = storage.build(body=body)
    assert len(json.dumps(spec)) > 600_000
    assert dict(essence)["spec"] == {"suspend": True, "signals": {"ok": _digest([1])}, "cancel": False}
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=essence)
    stored = patch["status"]["kopf"]["diffbase"]
    assert len(stored) < 1024
    # A change of a steering field is a change of the essence; the program is not part of it.
    other = kopf.Body({**body, "spec": {**spec, "suspend": False}})
    assert storage.build(body=other) != essence
    assert set(dict(storage.build(body=other))["spec"]) <= DIFFBASE_SPEC_FIELDS


def test_the_diffbase_keeps_a_digest_of_each_signal_not_its_value() -> None:
    """A big signal (even one the operator refuses) must not be copied into status: the object would pass the API
    server's size limit and no write of it could land again, the finalizer's removal included (issue 20, item 5)."""
    big = "v" * 900_000
    body = kopf.Body({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                      "metadata": {"name": "w", "namespace": "ns"}, "spec": {"signals": {"approve": big}}})
    storage = SteeringDiffBase(field="status.kopf.diffbase")
    essence = storage.build(body=body)
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=essence)
    assert len(patch["status"]["kopf"]["diffbase"]) < 256
    changed = kopf.Body({**body, "spec": {"signals": {"approve": big + "!"}}})
    assert storage.build(body=changed) != essence, "a changed value is still a change"

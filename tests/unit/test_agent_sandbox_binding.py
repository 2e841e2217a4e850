"""The agent-sandbox provider's identity rule (providers/agent_sandbox_binding.py): a claim's Pod is found through
the recorded claim uid and, once bound, the recorded Pod uid; anything else is the sandbox gone or refused."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sandbox.providers.agent_sandbox_binding import (
    ClaimRecord,
    NotReadyYet,
    PodBinding,
    bind_pod,
)
from durable_sandbox.providers.contract import SandboxGone

RECORD = ClaimRecord(namespace="team", claim="wf-1", claim_uid="claim-uid")
BOUND = ClaimRecord(namespace="team", claim="wf-1", claim_uid="claim-uid", pod_uid="pod-uid")


def claim(uid: str = "claim-uid", ready: str = "True", reason: str = "Ready", sandbox: str | None = "warm-abc"
          ) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": ready, "reason": reason}]}
    if sandbox:
        status["sandbox"] = {"name": sandbox}
    return {"metadata": {"name": "wf-1", "uid": uid}, "status": status}


def sandbox(owner_uid: str = "claim-uid", owner_kind: str = "SandboxClaim", pod: str | None = "warm-abc-pod"
            ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "warm-abc", "uid": "sandbox-uid", "ownerReferences": [
        {"kind": owner_kind, "uid": owner_uid, "controller": True}]}
    if pod:
        meta["annotations"] = {"agents.x-k8s.io/pod-name": pod}
    return {"metadata": meta}


def pod(uid: str = "pod-uid", owner_uid: str = "sandbox-uid") -> dict[str, Any]:
    return {"metadata": {"name": "warm-abc-pod", "uid": uid, "ownerReferences": [
        {"kind": "Sandbox", "uid": owner_uid, "controller": True}]}}


def test_a_ready_claim_binds_the_pod_its_sandbox_names() -> None:
    assert bind_pod(RECORD, claim(), sandbox(), pod()) == PodBinding(name="warm-abc-pod", uid="pod-uid")
    assert bind_pod(BOUND, claim(), sandbox(), pod()) == PodBinding(name="warm-abc-pod", uid="pod-uid")


def test_without_the_annotation_the_pod_is_named_as_its_sandbox() -> None:
    assert bind_pod(RECORD, claim(), sandbox(pod=None), pod()).name == "warm-abc"


def test_a_claim_not_ready_yet_is_waited_for_before_binding_and_gone_after() -> None:
    with pytest.raises(NotReadyYet, match="not Ready yet"):
        bind_pod(RECORD, claim(ready="False", reason="SandboxNotReady", sandbox=None), None, None)
    with pytest.raises(SandboxGone, match="no longer Ready"):
        bind_pod(BOUND, claim(ready="False", reason="SandboxNotReady"), sandbox(), pod())


@pytest.mark.parametrize(("args", "why"), [
    ((None, None, None), "SandboxClaim wf-1 was deleted"),
    ((claim(uid="other"), sandbox(), pod()), "deleted and made again"),
    ((claim(ready="False", reason="ClaimExpired"), sandbox(), pod()), "expired"),
    ((claim(), None, None), "Sandbox warm-abc was deleted"),
    ((claim(), sandbox(owner_uid="someone-else"), pod()), "not controlled by the recorded SandboxClaim"),
    ((claim(), sandbox(owner_kind="SandboxWarmPool"), pod()), "not controlled by the recorded SandboxClaim"),
    ((claim(), sandbox(), None), "Pod warm-abc-pod was deleted"),
    ((claim(), sandbox(), pod(owner_uid="another-sandbox")), "not controlled by Sandbox warm-abc"),
    ((claim(), sandbox(), pod(uid="made-again")), "was replaced"),
])
def test_anything_but_the_recorded_chain_is_the_sandbox_gone(args: tuple[Any, Any, Any], why: str) -> None:
    with pytest.raises(SandboxGone, match=why) as caught:
        bind_pod(BOUND, *args)
    assert caught.value.sandbox_id == "team/wf-1"


def test_labels_play_no_part() -> None:
    """A Pod carrying every label and annotation of the real one, but another uid, is still not the sandbox."""
    copy = pod(uid="made-again")
    copy["metadata"]["labels"] = {"agents.x-k8s.io/claim-uid": "claim-uid"}
    with pytest.raises(SandboxGone, match="replaced"):
        bind_pod(BOUND, claim(), sandbox(), copy)

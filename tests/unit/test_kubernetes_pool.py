"""Warm pools, the pure parts (providers/kubernetes_pool.py): the plan that keeps a pool at its size and rolls it,
the seals that tell the operator's Pods from forgeries, the tamper check and the claim patch."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sandbox.providers.kubernetes_pod_match import spec_mismatch
from durable_sandbox.providers.kubernetes_pool import (
    CLAIMED,
    OPERATION_KEY_LABEL,
    OWNER_KEY_LABEL,
    POOL_STATE_LABEL,
    SEAL_ANNOTATION,
    STARTING,
    TEMPLATE_HASH_LABEL,
    WARM,
    PoolPod,
    claim_patch,
    claimed_seal,
    creation_seal,
    derive_pool_key,
    plan_pool,
    template_hash,
    warm_seal,
)
from durable_sandbox.providers.kubernetes_template import PodTemplate

KEY = derive_pool_key(b"k" * 32)
NS, POOL = "team-a", "busy"
TEMPLATE = PodTemplate(image="localhost/busybox:dsb-test", imagePullPolicy="Never")
HASH = template_hash(TEMPLATE)


def pod(name: str, state: str, *, thash: str = HASH, seal: str | None = None, running: bool = True,
        created: str = "2026-12-03T00:00:00Z", terminated: bool = False, deleting: bool = False,
        waiting: str | None = None) -> dict[str, Any]:
    uid = f"uid-{name}"
    if seal is None:
        seal = {STARTING: creation_seal(KEY, NS, name, POOL, thash), WARM: warm_seal(KEY, NS, name, uid, POOL, thash),
                CLAIMED: claimed_seal(KEY, NS, name, uid, POOL, "", "")}[state]
    container: dict[str, Any] = {"ready": running and not terminated}
    container["state"] = ({"terminated": {"reason": "Error"}} if terminated else {"waiting": {"reason": waiting}}
                          if waiting else {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}})
    manifest = TEMPLATE.pod(name=name, namespace=NS, labels={POOL_STATE_LABEL: state, TEMPLATE_HASH_LABEL: thash},
                            annotations={SEAL_ANNOTATION: seal}, env_secret=None)
    manifest["metadata"].update(uid=uid, creationTimestamp=created, resourceVersion="7")
    if deleting:
        manifest["metadata"]["deletionTimestamp"] = "2026-12-03T00:01:00Z"
    manifest["status"] = {"phase": "Running", "containerStatuses": [container]}
    return manifest


def seen(*pods: dict[str, Any]) -> list[PoolPod]:
    return [PoolPod.of(p, KEY, POOL, hopeless=frozenset({"CrashLoopBackOff"})) for p in pods]


def test_an_empty_pool_creates_its_size_and_a_full_one_nothing() -> None:
    assert plan_pool([], size=3, thash=HASH).create == 3
    plan = plan_pool(seen(pod("a", WARM), pod("b", WARM), pod("c", WARM)), size=3, thash=HASH)
    assert (plan.create, plan.delete, plan.ready, plan.total) == (0, [], 3, 3)


def test_claimed_pods_are_counted_but_not_the_pools_size_so_it_refills() -> None:
    plan = plan_pool(seen(pod("a", WARM), pod("b", CLAIMED), pod("c", CLAIMED)), size=2, thash=HASH)
    assert (plan.ready, plan.claimed, plan.create, plan.total) == (1, 2, 1, 3)


def test_running_starters_are_promoted_and_waiting_ones_left_to_start() -> None:
    plan = plan_pool(seen(pod("a", STARTING), pod("b", STARTING, running=False)), size=2, thash=HASH)
    assert plan.promote == ["a"] and plan.starting == 2 and plan.create == 0


def test_a_template_change_rolls_every_unclaimed_pod_and_leaves_claimed_ones() -> None:
    old = "0" * 16
    plan = plan_pool(seen(pod("a", WARM, thash=old), pod("b", STARTING, thash=old), pod("c", CLAIMED, thash=old)),
                     size=2, thash=HASH)
    assert sorted(plan.delete) == ["a", "b"] and plan.create == 2 and plan.claimed == 1


def test_ended_pods_are_replaced_and_terminating_ones_not_counted() -> None:
    plan = plan_pool(seen(pod("a", WARM, terminated=True), pod("b", STARTING, waiting="CrashLoopBackOff"),
                          pod("c", WARM, deleting=True)), size=1, thash=HASH)
    assert sorted(plan.delete) == ["a", "b"] and plan.create == 1 and plan.total == 0  # counted before acting


def test_past_its_size_the_pool_deletes_the_youngest_starters_first_then_the_youngest_warm() -> None:
    pods = seen(pod("w-old", WARM, created="2026-12-03T00:00:01Z"), pod("w-new", WARM, created="2026-12-03T00:00:05Z"),
                pod("s-old", STARTING, created="2026-12-03T00:00:00Z"))
    assert plan_pool(pods, size=2, thash=HASH).delete == ["s-old"]
    assert plan_pool(pods, size=1, thash=HASH).delete == ["w-new", "s-old"]


@pytest.mark.parametrize("forged", [
    pod("f", WARM, seal="w.forged"),  # a seal nobody without the key can make
    pod("f", WARM, seal=""),
    pod("f", WARM, seal=warm_seal(KEY, NS, "other", "uid-f", POOL, HASH)),  # another Pod's seal, copied
    pod("f", WARM, seal=warm_seal(KEY, NS, "f", "another-uid", POOL, HASH)),  # a Pod made again under the name
    pod("f", WARM, seal=creation_seal(KEY, NS, "f", POOL, HASH)),  # a starter relabelled warm by hand
    pod("f", WARM, seal=claimed_seal(KEY, NS, "f", "uid-f", POOL, "", "")),  # a claimed Pod relabelled warm
    pod("f", "ready", seal="x"),
], ids=["made-up", "none", "other-pod", "other-uid", "starter-relabelled", "claimed-relabelled", "unknown-state"])
def test_a_pod_without_the_operators_seal_is_never_counted_promoted_or_deleted(forged: dict[str, Any]) -> None:
    (one,) = seen(forged)
    assert not one.sealed
    plan = plan_pool([one], size=1, thash=HASH)
    assert plan.ignored == ["f"] and plan.delete == [] and plan.promote == [] and plan.total == 0 and plan.create == 1


def test_another_key_seals_nothing() -> None:
    other = derive_pool_key(b"j" * 32)
    assert not PoolPod.of(pod("a", WARM), other, POOL).sealed
    assert not PoolPod.of(pod("a", WARM), KEY, "another-pool").sealed
    assert derive_pool_key(b"k" * 32) != b"k" * 32  # the journal key itself never seals a Pod


def test_the_template_hash_follows_every_field_of_the_pod() -> None:
    assert template_hash(TEMPLATE) == template_hash(PodTemplate(image="localhost/busybox:dsb-test",
                                                                imagePullPolicy="Never"))
    assert template_hash(TEMPLATE) != template_hash(TEMPLATE.with_image("localhost/busybox:other"))
    changed = TEMPLATE.model_copy(update={"resources": {"limits": {"memory": "1Gi"}}})
    assert template_hash(TEMPLATE) != template_hash(changed)


def test_tampering_with_what_a_pod_lets_be_patched_is_found() -> None:
    manifest = TEMPLATE.pod(name="a", namespace=NS, labels={}, annotations={}, env_secret=None)
    good = pod("a", WARM)
    assert spec_mismatch(good, manifest) is None
    swapped = pod("a", WARM)
    swapped["spec"]["containers"][0]["image"] = "evil:latest"
    assert "evil:latest" in str(spec_mismatch(swapped, manifest))
    debug = pod("a", WARM)
    debug["spec"]["ephemeralContainers"] = [{"name": "x", "image": "evil"}]
    assert "ephemeralContainers" in str(spec_mismatch(debug, manifest))


@pytest.mark.parametrize(("field", "value"), [
    ("runtimeClassName", None), ("hostNetwork", True), ("hostPID", True), ("hostIPC", True),
    ("serviceAccountName", "builder"), ("automountServiceAccountToken", True),
    ("securityContext", {"runAsUser": 0}), ("volumes", [{"name": "host", "hostPath": {"path": "/"}}]),
    ("initContainers", [{"name": "i", "image": "evil"}]),
])
def test_a_starting_pod_recreated_with_a_copied_seal_but_another_spec_is_refused(field: str, value: Any) -> None:
    """Issue 32 item 3: the creation seal cannot bind the uid; the spec compared with the template's does. The
    template runs under gVisor; the forgery changes one field the template fixes, keeping the copied seal."""
    template = TEMPLATE.model_copy(update={"runtime_class_name": "gvisor"})
    manifest = template.pod(name="", namespace="", labels={}, annotations={}, env_secret=None)
    forged = pod("a", STARTING)
    forged["spec"]["runtimeClassName"] = "gvisor"
    assert PoolPod.of(forged, KEY, POOL, manifest=manifest).refusal == ""
    forged["spec"][field] = value
    seen_pod = PoolPod.of(forged, KEY, POOL, manifest=manifest)
    assert seen_pod.sealed and field in seen_pod.refusal
    plan = plan_pool([seen_pod], size=1, thash=HASH)
    assert plan.ignored == ["a"] and plan.promote == [] and plan.delete == [] and plan.create == 1


def test_a_container_security_context_added_to_an_empty_one_is_no_default() -> None:
    manifest = TEMPLATE.pod(name="", namespace="", labels={}, annotations={}, env_secret=None)
    forged = pod("a", WARM)
    forged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert "securityContext" in str(spec_mismatch(forged, manifest))
    defaulted = pod("a", WARM)
    defaulted["spec"]["serviceAccountName"] = "default"
    assert spec_mismatch(defaulted, manifest) is None


def test_the_claim_patch_is_conditional_and_unseals_the_warm_pod_for_good() -> None:
    warm = pod("a", WARM)
    patch = claim_patch(warm, key=KEY, pool=POOL, labels={"durable-sandbox.dev/owner-key": "o"},
                        annotations={"durable-sandbox.dev/lease-expires-at": "1.0"})["metadata"]
    assert patch["resourceVersion"] == "7"  # 409 for every claimer but the first
    assert patch["labels"] == {"durable-sandbox.dev/owner-key": "o", POOL_STATE_LABEL: CLAIMED}
    assert patch["ownerReferences"] is None  # the session's now: not deleted with the pool
    claimed = pod("a", CLAIMED, seal=patch["annotations"][SEAL_ANNOTATION])
    claimed["metadata"]["labels"].update(patch["labels"])
    assert PoolPod.of(claimed, KEY, POOL).sealed
    claimed["metadata"]["labels"][POOL_STATE_LABEL] = WARM  # relabelled back by hand: not claimable
    assert not PoolPod.of(claimed, KEY, POOL).sealed


@pytest.mark.parametrize("label", [OWNER_KEY_LABEL, OPERATION_KEY_LABEL])
def test_a_claimed_pod_relabelled_to_another_owner_or_operation_loses_its_seal(label: str) -> None:
    """A retried provision adopts its claimed Pod by the operation's key label: whoever may label Pods must not
    be able to hand one run's sandbox to another by relabelling it."""
    labels = {OWNER_KEY_LABEL: "owner-a", OPERATION_KEY_LABEL: "op-a"}
    patch = claim_patch(pod("a", WARM), key=KEY, pool=POOL, labels=labels, annotations={})["metadata"]
    claimed = pod("a", CLAIMED, seal=patch["annotations"][SEAL_ANNOTATION])
    claimed["metadata"]["labels"].update(patch["labels"])
    assert PoolPod.of(claimed, KEY, POOL).sealed
    claimed["metadata"]["labels"][label] = "someone-else"
    assert not PoolPod.of(claimed, KEY, POOL).sealed

"""The wait for a new sandbox Pod to run (providers/kubernetes_startup.py), on scripted watch events, and the claim
path built on it (providers/kubernetes_provisioning.py, kubernetes_warm.py) on the fake core API: what each
provision asks of the API server before the first call.

Trust: the Pod's identity is the uid of the create's answer; a namesake (the Pod deleted and another made under
its name) is never taken as running, whatever its labels and state."""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest

from durable_sandbox.providers.contract import ProvisionError, SandboxSpec
from durable_sandbox.providers.kubernetes import KubernetesProvider
from durable_sandbox.providers.kubernetes_identity import SEAL
from durable_sandbox.providers.kubernetes_pool import derive_pool_key
from durable_sandbox.providers.kubernetes_startup import wait_running
from durable_sandbox.providers.kubernetes_template import PodTemplate
from tests.fakes.core_pods import FakeCore, FakeExec

NS, NAME, UID = "team-a", "dsb-1", "uid-ours"
RUNNING = {"phase": "Running", "containerStatuses": [{"ready": True, "state": {"running": {}}}]}
PENDING = {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}


def pod(status: dict[str, Any] | None = None, *, uid: str = UID, version: str = "10") -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": NAME, "uid": uid, "resourceVersion": version,
                         "labels": {"durable-sandbox.dev/sandbox-pod": "true"}},
            "status": copy.deepcopy(status) if status is not None else {"phase": "Pending"}}


class Script:
    """The API server's side: each watch request answers the next list of events; every request is kept."""

    def __init__(self, *watches: list[dict[str, Any]], reads: list[dict[str, Any] | None] | None = None) -> None:
        self.watches = list(watches)
        self.reads = list(reads or [])
        self.opened: list[tuple[str, int]] = []  # (resourceVersion, seconds) of each watch

    async def events(self, core: Any, namespace: str, name: str, version: str,
                     seconds: int) -> AsyncGenerator[dict[str, Any], None]:
        assert (namespace, name) == (NS, NAME)
        self.opened.append((version, seconds))
        for event in self.watches.pop(0) if self.watches else []:
            if event.get("type") == "ERROR":
                error = ProvisionError(f"watch: {event['object']['code']}", retryable=True)
                error.code = event["object"]["code"]  # type: ignore[attr-defined]
                raise error
            yield event

    async def read(self) -> dict[str, Any] | None:
        assert self.reads, "the wait read the Pod when nothing called for it"
        return self.reads.pop(0)


async def wait(script: Script, created: dict[str, Any], **limits: float) -> dict[str, Any]:
    return await wait_running(None, created, read=script.read, events=script.events,
                              ready_timeout=limits.get("ready_timeout", 30),
                              unschedulable_grace=limits.get("unschedulable_grace", 30))


async def test_the_running_event_ends_the_wait_from_one_watch_opened_at_the_creates_version() -> None:
    script = Script([{"type": "ADDED", "object": pod(PENDING, version="11")},
                     {"type": "MODIFIED", "object": pod(RUNNING, version="12")}])
    seen = await wait(script, pod(version="10"))
    assert seen["metadata"]["resourceVersion"] == "12" and "running" in str(seen["status"])
    assert [v for v, _ in script.opened] == ["10"]


async def test_a_pod_already_running_in_the_creates_answer_opens_no_watch() -> None:
    script = Script()
    await wait(script, pod(RUNNING))
    assert script.opened == []


@pytest.mark.parametrize("events", [
    # deleted, then a namesake made and running: never taken for the sandbox's Pod
    [{"type": "DELETED", "object": pod(PENDING)}, {"type": "ADDED", "object": pod(RUNNING, uid="uid-theirs")}],
    # the namesake seen without the deletion (a watch resumed after it): its uid tells it apart
    [{"type": "MODIFIED", "object": pod(RUNNING, uid="uid-theirs")}],
])
async def test_a_namesake_with_another_uid_is_never_taken_as_running(events: list[dict[str, Any]]) -> None:
    with pytest.raises(ProvisionError) as caught:
        await wait(Script(events), pod())
    assert caught.value.retryable
    assert "deleted while it started" in str(caught.value) or "uid-theirs, not uid-ours" in str(caught.value)


async def test_a_namesake_found_by_the_read_after_a_compacted_version_is_refused_too() -> None:
    script = Script([{"type": "ERROR", "object": {"code": 410}}], reads=[pod(RUNNING, uid="uid-theirs")])
    with pytest.raises(ProvisionError, match="replaced by another Pod of the same name"):
        await wait(script, pod())


async def test_a_compacted_version_is_read_again_and_watched_on_from_the_read() -> None:
    script = Script([{"type": "ERROR", "object": {"code": 410}}],
                    [{"type": "MODIFIED", "object": pod(RUNNING, version="31")}], reads=[pod(PENDING, version="30")])
    assert (await wait(script, pod()))["metadata"]["resourceVersion"] == "31"
    assert [v for v, _ in script.opened] == ["10", "30"]


async def test_a_watch_that_ends_quietly_is_followed_by_a_read_and_bookmarks_move_the_version_on() -> None:
    script = Script([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}],
                    [{"type": "MODIFIED", "object": pod(RUNNING, version="41")}], reads=[pod(PENDING, version="40")])
    await wait(script, pod())
    assert [v for v, _ in script.opened] == ["10", "40"]


async def test_a_hopeless_start_fails_at_its_event_not_retryable() -> None:
    pulling = {"phase": "Pending", "containerStatuses": [{"image": "nope:1", "state": {"waiting": {
        "reason": "ErrImagePull", "message": "not found"}}}]}
    with pytest.raises(ProvisionError, match="ErrImagePull: the image cannot be pulled") as caught:
        await wait(Script([{"type": "MODIFIED", "object": pod(pulling)}]), pod())
    assert not caught.value.retryable


async def test_unschedulable_past_the_grace_fails_and_the_deadline_bounds_the_wait() -> None:
    stuck = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                 "message": "0/1 nodes are available"}]}
    with pytest.raises(ProvisionError, match="cannot be scheduled: 0/1 nodes") as caught:
        await wait(Script(), pod(stuck), unschedulable_grace=0)
    assert not caught.value.retryable
    with pytest.raises(ProvisionError, match="was not running after 0s") as late:
        await wait(Script(), pod(PENDING), ready_timeout=0)
    assert late.value.retryable


# ---- the claim path on the fake core API: what a provision asks of the API server before its first call


class CountingCore(FakeCore):
    def __init__(self) -> None:
        super().__init__(running=False)
        self.reads = 0
        self.pod_patches: list[dict[str, Any]] = []

    def read_namespaced_pod_without_preload_content(self, name: str, namespace: str) -> Any:
        self.reads += 1
        return super().read_namespaced_pod_without_preload_content(name, namespace)

    def patch_namespaced_pod_without_preload_content(self, name: str, namespace: str, body: Any) -> Any:
        self.pod_patches.append(copy.deepcopy(body))
        return super().patch_namespaced_pod_without_preload_content(name, namespace, body)


def provider_on(core: FakeCore) -> tuple[KubernetesProvider, FakeExec]:
    provider = KubernetesProvider(namespace=NS, environ={}, pool_key=derive_pool_key(b"k" * 32),
                                  template=PodTemplate(image="busybox"), ready_timeout=5)
    provider._core = core
    runner = FakeExec()
    provider._exec = cast(Any, runner)
    return provider, runner


async def test_a_cold_provision_waits_on_a_watch_and_checks_the_image_without_reads_around_it() -> None:
    core = CountingCore()
    provider, runner = provider_on(core)
    handle = await provider.provision(SandboxSpec(owner=f"{NS}/u1", operation_id="op-1"), lease_seconds=600)
    assert len(core.watches) == 1 and core.watches[0][1] == f"metadata.name={handle.metadata['pod']}"
    assert core.reads == 0  # no poll, and no Pod reads around the image check: the seal is bound to the uid
    assert len(runner.runs) == 1 and len(core.pod_patches) == 1 and SEAL in str(core.pod_patches[0])
    await provider.aclose()


async def test_a_replaced_pod_fails_the_cold_provision_and_only_the_own_uid_is_deleted() -> None:
    core = CountingCore()
    provider, _ = provider_on(core)
    real_watch = core._watch

    def replaced(namespace: str, selector: str, options: Any) -> Any:
        name = selector.removeprefix("metadata.name=")
        core.pods.pop((namespace, name))  # a namespace user deletes the Pod and makes a namesake, running
        core.running = True
        core.put_pod({"metadata": {"namespace": namespace, "name": name}, "spec": {}})
        core.running = False
        return real_watch(namespace, selector, options)

    core._watch = replaced  # type: ignore[method-assign]
    with pytest.raises(ProvisionError, match="replaced by another Pod of the same name"):
        await provider.provision(SandboxSpec(owner=f"{NS}/u1", operation_id="op-1"), lease_seconds=600)
    (namesake,) = core.pods.values()
    assert SEAL not in namesake["metadata"]["annotations"] and core.deleted == []
    await provider.aclose()


async def test_a_warm_claim_is_sealed_by_its_claim_patch_and_runs_no_exec_before_the_first_call() -> None:
    core = CountingCore()
    core.running = True  # the pool's Pods are running when they are made warm
    provider, runner = provider_on(core)
    core.templates[(NS, "busy")] = {"metadata": {"name": "busy", "namespace": NS}, "template": {"spec": {
        "containers": [{"name": "sandbox", "image": "busybox"}]}}}
    owner = {"apiVersion": "v1", "kind": "PodTemplate", "name": "busy", "uid": "uid-template"}
    warm = await provider.make_pool_pod(NS, "busy", owner, await provider.pool_template(NS, "busy"))
    made = core.get(NS, warm)
    assert made is not None and await provider.promote_pool_pod(made, "busy")
    core.pod_patches.clear()
    execs = len(runner.runs)
    handle = await provider.provision(SandboxSpec(owner=f"{NS}/u1", operation_id="op-w", template="podtemplate/busy"),
                                      lease_seconds=600)
    assert handle.metadata["pod"] == warm and len(runner.runs) == execs
    (claim,) = core.pod_patches  # the claim, conditional on the version read, carries the seal: no second patch
    assert claim["metadata"]["resourceVersion"] and SEAL in claim["metadata"]["annotations"]
    assert [h.id for h in await provider.list_sandboxes(f"{NS}/u1")] == [handle.id]  # the operator's own
    await provider.aclose()


async def test_a_watch_the_operator_may_not_make_says_so_and_deletes_its_pod() -> None:
    from kubernetes.aio.client.exceptions import ApiException

    from durable_sandbox.providers.contract import ConfigurationError

    core = CountingCore()
    provider, _ = provider_on(core)

    def forbidden(namespace: str, selector: str, options: Any) -> Any:
        raise ApiException(status=403, reason='pods is forbidden: User "op" cannot watch resource "pods"')

    core._watch = forbidden  # type: ignore[method-assign]
    with pytest.raises(ConfigurationError, match=r"watch Pod team-a/dsb-.* until it runs: .*check the operator's RBAC"):
        await provider.provision(SandboxSpec(owner=f"{NS}/u1", operation_id="op-1"), lease_seconds=600)
    assert core.pods == {} and [kind for kind, _, _ in core.deleted] == ["Pod"]
    await provider.aclose()

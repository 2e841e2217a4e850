"""The ``agent-sandbox`` provider (issue 37 item 2) on a fake API: agent-sandbox's claims and Sandboxes
(tests/fakes/agent_sandbox_objects.py, its controller's binding done at once) beside the fake core API's Pods and
exec (tests/fakes/core_pods.py). What it makes, where its execs go, what it believes (the recorded claim and Pod
uids, never a label), what is SandboxGone, what it deletes, and what its capabilities and settings say."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durable_sandbox.providers.agent_sandbox import AgentSandboxProvider
from durable_sandbox.providers.agent_sandbox_claims import CLAIM_UID, lease_of
from durable_sandbox.providers.agent_sandbox_settings import AgentSandboxSettings
from durable_sandbox.providers.contract import (
    Capability,
    ConfigurationError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    UnsupportedCapability,
)
from durable_sandbox.providers.kubernetes_identity import OWNER_KEY_LABEL, SEAL
from durable_sandbox.providers.registry import available_providers, create_provider
from durable_sandbox.providers.s3_snapshots import S3Config
from durable_sandbox.testing import FakeClock
from tests.fakes.agent_sandbox_objects import CONTAINER
from tests.unit.agent_sandbox_world_support import INSTALLATION, NS, OWNER, World, shell, spec


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    yield w
    await w.provider.aclose()


async def test_a_sandbox_is_a_claim_on_the_named_warm_pool_leased_by_its_shutdown_time(world: World) -> None:
    before = time.time()
    handle = await world.provider.provision(spec(), lease_seconds=600)
    claim = world.claim_of(handle)
    assert claim["kind"] == "SandboxClaim" and claim["spec"]["warmPoolRef"] == {"name": "warm"}
    lifecycle = claim["spec"]["lifecycle"]
    assert lifecycle["shutdownPolicy"] == "Delete"
    expires = lease_of(claim)
    assert expires is not None and before + 598 <= expires <= time.time() + 601
    assert handle.id == f"{NS}/{claim['metadata']['name']}" and handle.provider == "agent-sandbox"
    pod = world.core.get(NS, claim["status"]["sandbox"]["name"])
    assert pod is not None
    assert handle.metadata[CLAIM_UID] == claim["metadata"]["uid"] and handle.metadata["uid"] == pod["metadata"]["uid"]
    assert handle.metadata["container"] == CONTAINER and handle.metadata["owner"] == OWNER
    assert claim["metadata"]["annotations"][SEAL].startswith("s.")
    # The workspace was made and the image checked in that Pod, in one exec (the only one before the first call).
    assert world.exec.runs == [(NS, pod["metadata"]["name"])]
    (setup,) = world.exec.sent
    assert setup.index(b"mkdir -p --") < setup.index(b"command -v")


async def test_calls_go_to_the_pod_the_claims_sandbox_names_even_a_warm_one_of_another_name(world: World) -> None:
    world.objects.auto_bind = False
    original = world.objects.get

    async def bind_warm(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = world.objects.objects.get((plural, namespace, name))
        if plural == "sandboxclaims" and found is not None and not found.get("status"):
            world.objects.bind(namespace, name, sandbox_name="warm-abcde")  # adopted from the pool
        return await original(plural, namespace, name)

    world.objects.get = bind_warm  # type: ignore[method-assign]
    handle = await world.provider.provision(spec(), lease_seconds=600)
    world.exec.runs.clear()
    result = await world.provider.execute(handle, shell())
    assert result.exit_code == 0
    assert world.exec.runs == [(NS, "warm-abcde")]


async def test_a_claim_deleted_by_hand_is_gone_and_nothing_is_sent(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    world.objects.delete_by_hand(NS, handle.id.split("/")[1])
    world.exec.runs.clear()
    with pytest.raises(SandboxGone, match=r"SandboxClaim \S+ was deleted"):
        await world.provider.execute(handle, shell())
    assert world.exec.runs == []


async def test_a_claim_deleted_and_made_again_under_its_name_is_not_the_sandbox(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    name = handle.id.split("/")[1]
    planted = {**world.claim_of(handle)}
    world.objects.delete_by_hand(NS, name)
    await world.objects.create("sandboxclaims", NS, planted)  # every label and annotation copied, a new uid
    world.objects.bind(NS, name)
    world.exec.runs.clear()
    with pytest.raises(SandboxGone, match="made again"):
        await world.provider.execute(handle, shell())
    assert world.exec.runs == []
    with pytest.raises(SandboxGone, match="made again"):
        await world.provider.renew_lease(handle, 600)
    await world.provider.destroy(handle)  # the recorded uid only: the namesake stays
    assert world.objects.claim(NS, name) is not None


async def test_a_pod_replaced_under_its_name_with_the_owner_reference_copied_is_gone(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    pod_name = world.claim_of(handle)["status"]["sandbox"]["name"]
    pod = world.core.get(NS, pod_name)
    assert pod is not None
    world.core.delete(NS, pod_name)
    world.core.put_pod({"metadata": {k: pod["metadata"][k] for k in ("name", "namespace", "ownerReferences")},
                        "spec": pod["spec"]})
    world.exec.runs.clear()
    with pytest.raises(SandboxGone, match="replaced"):
        await world.provider.execute(handle, shell())
    assert world.exec.runs == []


async def test_a_pod_replaced_while_a_call_ran_makes_its_result_unused(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    pod_name = world.claim_of(handle)["status"]["sandbox"]["name"]

    def replace(namespace: str, pod: str) -> None:
        old = world.core.get(namespace, pod)
        assert old is not None
        world.core.delete(namespace, pod)
        world.core.put_pod({"metadata": {k: old["metadata"][k] for k in ("name", "namespace", "ownerReferences")}})

    world.exec.during = replace
    with pytest.raises(SandboxGone, match=f"{pod_name} was deleted or replaced"):
        await world.provider.execute(handle, shell())


async def test_a_claim_its_controller_expired_is_gone(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    world.objects.expire(NS, handle.id.split("/")[1])
    with pytest.raises(SandboxGone, match="expired"):
        await world.provider.execute(handle, shell())


async def test_destroy_deletes_the_claim_by_uid_and_its_sandbox_and_pod_go_with_it(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    await world.provider.destroy(handle)
    assert world.objects.objects == {} and world.core.pods == {}
    await world.provider.destroy(handle)  # idempotent
    with pytest.raises(SandboxGone):
        await world.provider.execute(handle, shell())


async def test_a_retried_provision_adopts_its_sealed_claim_and_refuses_a_planted_one(world: World) -> None:
    first = await world.provider.provision(spec(), lease_seconds=600)
    again = await world.provider.provision(spec(), lease_seconds=600)
    assert again.id == first.id and again.metadata[CLAIM_UID] == first.metadata[CLAIM_UID]
    assert again.metadata["uid"] == first.metadata["uid"]
    # Someone plants a claim under the name the next operation will use, copying the labels of ours.
    planted_name = (await _name_for(world, "op-2"))
    labels = dict(world.claim_of(first)["metadata"]["labels"])
    await world.objects.create("sandboxclaims", NS, {"metadata": {"name": planted_name, "namespace": NS,
                                                                   "labels": labels}, "spec": {}})
    with pytest.raises(ProvisionError, match="is not the operator's") as refused:
        await world.provider.provision(spec("op-2"), lease_seconds=600)
    assert not refused.value.retryable and "kubectl delete sandboxclaim" in str(refused.value)
    assert world.objects.claim(NS, planted_name) is not None  # not deleted


async def _name_for(world: World, operation: str) -> str:
    from durable_sandbox.providers.kubernetes_provisioning import pod_name

    return pod_name(operation)


async def test_listings_hold_only_sealed_claims_never_one_with_their_labels_copied(world: World) -> None:
    handle = await world.provider.provision(spec(), lease_seconds=600)
    claim = world.claim_of(handle)
    forged = {"metadata": {"name": "forged", "namespace": NS, "labels": dict(claim["metadata"]["labels"]),
                           "annotations": dict(claim["metadata"]["annotations"])}, "spec": claim["spec"]}
    await world.objects.create("sandboxclaims", NS, forged)
    listed = await world.provider.list_sandboxes(OWNER)
    assert [h.id for h in listed] == [handle.id]
    assert listed[0].metadata["uid"] == handle.metadata["uid"]
    assert [h.id for h in await world.provider.inventory_sandboxes(INSTALLATION)] == [handle.id]
    assert claim["metadata"]["labels"][OWNER_KEY_LABEL]


async def test_a_lease_renewed_moves_the_shutdown_time_and_one_run_out_deletes_the_claim() -> None:
    clock = FakeClock(start=time.time())
    w = World(clock)
    handle = await w.provider.provision(spec(), lease_seconds=60)
    renewed = await w.provider.renew_lease(handle, 600)
    assert renewed.lease_expires_at == pytest.approx(clock() + 600)
    assert lease_of(w.claim_of(handle)) == pytest.approx(clock() + 600, abs=1)
    clock.advance(601)
    with pytest.raises(SandboxGone, match="lease ran out"):
        await w.provider.execute(handle, shell())
    assert w.objects.objects == {}


async def test_a_claim_that_never_binds_fails_saying_why(world: World) -> None:
    world.objects.auto_bind = False
    with pytest.raises(ProvisionError, match="not Ready yet") as failed:
        await world.provider.provision(spec(), lease_seconds=600)
    assert failed.value.retryable
    assert world.objects.objects == {}  # the claim it made was deleted


async def test_what_it_refuses_to_provision(world: World) -> None:
    with pytest.raises(ProvisionError, match="plain text") as env:
        await world.provider.provision(spec(env={"TOKEN": "secret-value"}), lease_seconds=600)
    assert "secret-value" not in str(env.value) and not env.value.retryable
    with pytest.raises(ProvisionError, match="no SandboxWarmPool named"):
        await world.provider.provision(spec(template=None), lease_seconds=600)
    with pytest.raises(ProvisionError, match="not a SandboxWarmPool name"):
        await world.provider.provision(spec(template="podtemplate/x"), lease_seconds=600)
    assert world.objects.objects == {}


async def test_capabilities_say_what_it_cannot_do() -> None:
    plain = World().provider
    caps = plain.capabilities()
    assert not caps.supports(Capability.SUSPEND) and not caps.supports(Capability.RESUME)
    assert not caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.INVENTORY)
    assert caps.consistency_problems() == []
    with pytest.raises(UnsupportedCapability):
        await plain.suspend(SandboxHandle(id=f"{NS}/x", provider="agent-sandbox"))
    stored = World(store=S3Config(bucket="b", access_key_id="a", secret_access_key="s", endpoint="http://127.0.0.1:1")).provider
    assert {Capability.SNAPSHOT, Capability.RESTORE, Capability.SNAPSHOT_DELETION} <= stored.capabilities().supported
    # Not advertised, so refused before the store is asked (the code it shares with the kubernetes provider can
    # copy; CI's node tier found it copying for the contract kit, which expected a refusal).
    assert not stored.capabilities().supports(Capability.SNAPSHOT_COPY)
    with pytest.raises(UnsupportedCapability):
        await stored.copy_snapshot("kit-no-such-snapshot", operation_id="copy-1")
    await plain.aclose()
    await stored.aclose()


async def test_it_is_registered_and_its_settings_name_what_is_wrong() -> None:
    assert available_providers()["agent-sandbox"] is AgentSandboxProvider
    provider = create_provider("agent-sandbox", environ={"DSB_AGENT_SANDBOX_WARM_POOL": "warm"})
    assert isinstance(provider, AgentSandboxProvider) and provider.settings.warm_pool == "warm"
    await provider.aclose()
    assert "DSB_AGENT_SANDBOX_ENABLED=true" in AgentSandboxProvider.configuration_problems({})[0]
    problems = AgentSandboxProvider.configuration_problems({"DSB_AGENT_SANDBOX_ENABLED": "true",
                                                            "DSB_AGENT_SANDBOX_WORKSPACE": "relative",
                                                            "DSB_AGENT_SANDBOX_READY_TIMEOUT": "-1"})
    assert len(problems) == 1
    assert "DSB_AGENT_SANDBOX_WORKSPACE" in problems[0] and "DSB_AGENT_SANDBOX_READY_TIMEOUT" in problems[0]
    with pytest.raises(ConfigurationError, match="DSB_AGENT_SANDBOX_WARM_POOL"):
        AgentSandboxSettings.from_environ({"DSB_AGENT_SANDBOX_WARM_POOL": "Not/A/Name"})
    assert AgentSandboxProvider.configuration_problems({"DSB_AGENT_SANDBOX_ENABLED": "true"}) == []


async def test_a_call_killed_because_its_claim_was_deleted_is_the_sandboxs_loss_not_its_result(world: World) -> None:
    """The Pod's container killed under a running call (exit 137 on the status channel) is asked about: its claim
    deleted by hand meanwhile makes it SandboxGone, never a result to record."""
    handle = await world.provider.provision(spec(), lease_seconds=600)
    fresh = await world.provider.provision(spec("op-2"), lease_seconds=600)
    world.exec.exit_code = 137
    world.exec.during = lambda namespace, pod: world.objects.delete_by_hand(NS, handle.id.split("/")[1])
    with pytest.raises(SandboxGone, match="deleted"):
        await world.provider.execute(handle, shell("sleep 30"))
    world.exec.during = None
    killed = await world.provider.execute(fresh, shell("kill -9 $$"))  # its Pod and claim still there: a result
    assert killed.exit_code == 137

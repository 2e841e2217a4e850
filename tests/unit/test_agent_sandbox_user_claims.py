"""A Workflow on a SandboxClaim a user made (issue 37, item 3): ``template: sandboxclaim/<name>``. The claim is bound
once, by the session's first provision, by its uid and its Pod's uid; a namesake is gone, never adopted or re-bound;
the operator never creates, patches or deletes it (destroy, a lease run out, an injected loss only forget it); a claim
the operator made for another run is refused. On the provider's fake of agent-sandbox's API."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durable_sandbox.providers.agent_sandbox_claims import CLAIM_UID
from durable_sandbox.providers.agent_sandbox_user_claims import USER_CLAIM, first_provision, user_claim_name
from durable_sandbox.providers.contract import INSTALLATION_LABEL, ProvisionError, SandboxGone, SandboxSpec
from durable_sandbox.testing import FakeClock
from tests.unit.agent_sandbox_world_support import INSTALLATION, NS, OWNER, World, shell, spec

FIRST = "run-1/main/provision"  # a session's first provision (sandboxes/journal.provision_id)
CLAIM = "users-claim"


def on_claim(operation: str = FIRST, name: str = CLAIM) -> SandboxSpec:
    return SandboxSpec(template=f"sandboxclaim/{name}", owner=OWNER, operation_id=operation,
                       labels={INSTALLATION_LABEL: INSTALLATION})


async def users_claim(world: World, name: str = CLAIM) -> dict[str, Any]:
    """A claim as its user makes it (kubectl apply): no seal; the fake's controller binds it on its next read."""
    await world.objects.create("sandboxclaims", NS, {"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                                                     "kind": "SandboxClaim",
                                                     "metadata": {"name": name, "namespace": NS},
                                                     "spec": {"warmPoolRef": {"name": "python-pool"}}})
    claim = world.objects.bind(NS, name)
    world.objects.calls.clear()  # the user's own writes: what the operator does is recorded from here
    return claim


def writes_to(world: World, name: str = CLAIM) -> list[str]:
    return [verb for verb, (plural, _ns, obj) in world.objects.calls
            if plural == "sandboxclaims" and obj == name and verb in ("create", "patch", "delete")]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    yield w
    await w.provider.aclose()


def test_the_template_names_a_users_claim_and_only_a_first_provision_binds_one() -> None:
    from durable_sandbox.sandboxes.journal import provision_id

    assert first_provision(f"run-1/{provision_id('main')}"), "the session's provision id (sandboxes/provisioning.py)"
    assert user_claim_name("sandboxclaim/mine") == "mine"
    assert user_claim_name("python-pool") is None and user_claim_name(None) is None
    assert first_provision(FIRST) and not first_provision("run-1/main/restore-2") and not first_provision(None)


async def test_a_users_claim_is_bound_by_its_uids_and_calls_run_in_its_pod(world: World) -> None:
    claim = await users_claim(world)
    handle = await world.provider.provision(on_claim(), lease_seconds=600)
    pod = world.core.get(NS, CLAIM)
    assert pod is not None
    assert handle.id == f"{NS}/{CLAIM}" and handle.metadata[USER_CLAIM] is True
    assert handle.metadata[CLAIM_UID] == claim["metadata"]["uid"] and handle.metadata["uid"] == pod["metadata"]["uid"]
    world.exec.runs.clear()
    assert (await world.provider.execute(handle, shell())).exit_code == 0
    assert world.exec.runs == [(NS, CLAIM)]
    renewed = await world.provider.renew_lease(handle, 900)
    assert renewed.lease_expires_at is not None and renewed.lease_expires_at > time.time() + 800
    assert writes_to(world) == [], "the user's claim is never created, patched (lease, seal) or deleted"
    assert await world.provider.list_sandboxes(OWNER) == [], "never listed: the orphan sweep cannot reach it"
    assert await world.provider.inventory_sandboxes(INSTALLATION) == []


async def test_destroy_a_lease_run_out_and_an_injected_loss_release_it_and_never_delete_it() -> None:
    clock = FakeClock(start=time.time())
    w = World(clock)
    await users_claim(w)
    handle = await w.provider.provision(on_claim(), lease_seconds=60)
    clock.advance(61)
    with pytest.raises(SandboxGone, match=r"lease ran out .*not deleted"):
        await w.provider.execute(handle, shell())
    await w.provider.destroy(handle)
    await w.provider.inject_loss(handle)
    assert writes_to(w) == [] and w.objects.claim(NS, CLAIM) is not None and w.core.get(NS, CLAIM) is not None
    with pytest.raises(SandboxGone):
        await w.provider.execute(handle, shell())


async def test_a_namesake_of_the_users_claim_is_gone_and_never_bound_again(world: World) -> None:
    await users_claim(world)
    handle = await world.provider.provision(on_claim(), lease_seconds=600)
    world.objects.delete_by_hand(NS, CLAIM)
    await users_claim(world)  # the same name, made again: another uid, another Pod
    world.exec.runs.clear()
    with pytest.raises(SandboxGone, match="made again"):
        await world.provider.execute(handle, shell())
    with pytest.raises(SandboxGone, match="made again"):
        await world.provider.renew_lease(handle, 600)
    assert world.exec.runs == []
    world.objects.calls.clear()
    # The run's recovery: a restore, or a fresh sandbox after the loss, never reads the name again.
    for operation in ("run-1/main/restore-1", None):
        with pytest.raises(ProvisionError, match="does not bind that name again") as refused:
            await world.provider.provision(on_claim(operation or "random"), lease_seconds=600)
        assert not refused.value.retryable and "SandboxWarmPool" in str(refused.value)
    assert world.objects.calls == [] and world.exec.runs == []
    await world.provider.destroy(handle)
    assert world.objects.claim(NS, CLAIM) is not None, "the namesake is left alone"


async def test_a_replaced_pod_of_the_users_claim_is_gone(world: World) -> None:
    await users_claim(world)
    handle = await world.provider.provision(on_claim(), lease_seconds=600)
    pod = world.core.get(NS, CLAIM)
    assert pod is not None
    world.core.pods.pop((NS, CLAIM))
    world.core.put_pod({**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k != "uid"}})
    with pytest.raises(SandboxGone, match="replaced"):
        await world.provider.execute(handle, shell())


async def test_what_a_workflow_may_not_bind(world: World) -> None:
    with pytest.raises(ProvisionError, match="does not exist; create it") as missing:
        await world.provider.provision(on_claim(), lease_seconds=600)
    assert not missing.value.retryable
    with pytest.raises(ProvisionError, match="not a SandboxClaim name"):
        await world.provider.provision(on_claim(name="Bad_Name"), lease_seconds=600)
    ours = await world.provider.provision(spec("op-7"), lease_seconds=600)  # another run's claim, sealed
    with pytest.raises(ProvisionError, match="made by the operator for another run"):
        await world.provider.provision(on_claim(name=ours.id.split("/")[1]), lease_seconds=600)
    assert (await world.provider.execute(ours, shell())).exit_code == 0

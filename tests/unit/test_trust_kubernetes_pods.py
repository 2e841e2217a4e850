"""Issue 32 items 1-3 in the unit tier: the trust kit (tests/unit/trust_support.py) against every component that
lists or watches sandbox Pods, on the fake core API (tests/fakes/core_pods.py): the kubernetes provider's
listings and its retried provision (adopt by name), the Sandbox controller's adoption, the SandboxPool
controller (promotion and claims) and the orphan sweep. Then the deletion rules (item 2) one by one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest

from durable_sandbox.kube.pool.controller import PoolController, PoolView
from durable_sandbox.kube.sandbox.controller import SandboxController
from durable_sandbox.kube.sandbox.view import OPERATION_LABEL, SandboxView
from durable_sandbox.kube.sweep.orphans import sweep_once
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProvisionError,
    SandboxGone,
    SandboxSpec,
    ToolCall,
)
from durable_sandbox.providers.kubernetes import KubernetesProvider, pod_name
from durable_sandbox.providers.kubernetes_exec import ExecOutcome
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    OPERATION_KEY_LABEL,
    OWNER_KEY_LABEL,
    SEAL,
    creation_mark,
    env_secret_name,
)
from durable_sandbox.providers.kubernetes_pool import POOL_STATE_LABEL, WARM, derive_pool_key
from durable_sandbox.providers.kubernetes_template import PodTemplate
from durable_sandbox.testing import FakeClock
from tests.fakes.core_pods import FakeCore, FakeExec
from tests.fakes.custom_objects import FakeCustomObjects

from .trust_support import FORGERIES, Attack, TrustKit, recreate

NS = "team-a"
KEY = derive_pool_key(b"k" * 32)
INSTALLATION = "inst-1"
OWNER = f"{NS}/uid-owner"
TEMPLATE = PodTemplate(image="localhost/busybox:dsb-test", imagePullPolicy="Never", runtimeClassName="gvisor")


def provider_on(core: FakeCore, clock: FakeClock | None = None) -> KubernetesProvider:
    provider = KubernetesProvider(namespace=NS, environ={}, pool_key=KEY, template=TEMPLATE, ready_timeout=5,
                                  clock=clock or time.time)
    provider._core = core
    provider._exec = cast(Any, FakeExec())
    return provider


def spec(operation: str = "op-1", owner: str = OWNER, **extra: Any) -> SandboxSpec:
    return SandboxSpec(owner=owner, operation_id=operation, **extra,
                       labels={INSTALLATION_LABEL: INSTALLATION, OPERATION_LABEL: operation})


def env_secret_of(pod: dict[str, Any] | None) -> str:
    """The name of the env Secret a sandbox Pod reads (its container's envFrom)."""
    assert pod is not None
    (source,) = pod["spec"]["containers"][0]["envFrom"]
    return str(source["secretRef"]["name"])


def uid_of(handle: Any) -> str:
    return str(handle.metadata["uid"])


@pytest.fixture
def core() -> FakeCore:
    return FakeCore()


@pytest.fixture
async def provider(core: FakeCore) -> AsyncIterator[KubernetesProvider]:
    provider = provider_on(core)
    yield provider
    await provider.aclose()


async def genuine_pod(core: FakeCore, provider: KubernetesProvider, **extra: Any) -> dict[str, Any]:
    handle = await provider.provision(spec(**extra), lease_seconds=600)
    pod = core.get(NS, handle.metadata["pod"])
    assert pod is not None
    return pod


class TestProviderListings(TrustKit):
    """``list_sandboxes`` (what a Sandbox adopts and destroys) and the inventory (what the orphan sweep sees)."""

    @pytest.fixture
    async def world(self, core: FakeCore, provider: KubernetesProvider) -> Attack:
        genuine = await genuine_pod(core, provider)

        async def act() -> set[str]:
            listed = [*await provider.list_sandboxes(OWNER), *await provider.inventory_sandboxes(INSTALLATION)]
            return {uid_of(h) for h in listed}

        return Attack(core, genuine, act)


class TestProviderRetriedProvision(TrustKit):
    """A provision retried after a lost answer (or an operator restart) adopts the Pod of its name only if the
    operator sealed it over its uid for this operation."""

    @pytest.fixture
    async def world(self, core: FakeCore, provider: KubernetesProvider) -> Attack:
        genuine = await genuine_pod(core, provider, env={"TOKEN": "t"})  # (its env Secret: item 2 too)

        async def act() -> set[str]:
            try:
                return {uid_of(await provider.provision(spec(env={"TOKEN": "t"}), lease_seconds=600))}
            except ProvisionError as refused:
                assert "is not the operator's" in str(refused) and "kubectl delete pod" in str(refused)
                return set()

        # Only the Pod under the operation's own name is looked at by a retried provision.
        return Attack(core, genuine, act, meets=frozenset({"recreated", "annotation_edited"}))


class TestSandboxControllerAdoption(TrustKit):
    """Issue 32 item 1: a Sandbox's provision adopts the sandbox an interrupted attempt made, and destroys every
    other one it owns that it has not recorded: neither by labels."""

    @pytest.fixture
    async def world(self, core: FakeCore, provider: KubernetesProvider) -> Attack:
        view = SandboxView(namespace=NS, name="box", uid="uid-owner", body={"metadata": {"namespace": NS}}, status={})
        controller = SandboxController(cast(Any, None), cast(Any, None), lambda _: provider,
                                       records=cast(Any, None), holding=cast(Any, None))
        genuine = await genuine_pod(core, provider, operation="dsbx-op-1")
        assert view.owner == OWNER

        async def act() -> set[str]:
            adopted = await controller._adopt(view, provider, "dsbx-op-1")
            return {uid_of(adopted)} if adopted is not None else set()

        return Attack(core, genuine, act)


class TestOrphanSweep(TrustKit):
    """Issue 32 item 2: the sweep destroys its installation's sandboxes whose owner is gone, and nothing else."""

    @pytest.fixture
    async def world(self, core: FakeCore, provider: KubernetesProvider) -> Attack:
        genuine = await genuine_pod(core, provider, env={"TOKEN": "t"})
        assert core.secret(NS, env_secret_of(genuine)) is not None

        async def act() -> set[str]:
            result = await sweep_once(provider, installation=INSTALLATION, live={}, first_seen={}, now=time.time(),
                                      grace=0)
            return {uid_of(o.handle) for o in result.destroyed if o.handle is not None}

        return Attack(core, genuine, act, genuine_used=False)


class TestPoolController(TrustKit):
    """Issue 32 item 3: the pool's reconciler promotes only its own Pods of the template's spec, and a claim
    takes only those; a starting Pod re-created under its name with the creation seal copied is neither."""

    @pytest.fixture
    async def world(self, core: FakeCore, provider: KubernetesProvider) -> Attack:
        core.templates[(NS, "busy")] = {"metadata": {"name": "busy", "namespace": NS},
                                        "template": {"spec": {"runtimeClassName": "gvisor", "containers": [
                                            {"name": "sandbox", "image": "localhost/busybox:dsb-test",
                                             "imagePullPolicy": "Never"}]}}}
        controller = PoolController(cast(Any, None), lambda: provider, OperatorMetrics(process_collectors=False))
        controller.objects = FakeCustomObjects()
        body = {"metadata": {"namespace": NS, "name": "busy", "uid": "uid-pool", "generation": 1},
                "spec": {"template": "busy", "size": 1}}
        view = PoolView(namespace=NS, name="busy", uid="uid-pool", body=body)
        await controller._turn(view)  # makes one starting Pod
        (genuine,) = core.pods.values()
        promoted: set[str] = set()
        promote = provider.promote_pool_pod

        async def recording(pod: dict[str, Any], pool: str) -> bool:
            promoted.add(pod["metadata"]["uid"])
            return await promote(pod, pool)

        provider.promote_pool_pod = recording  # type: ignore[method-assign]

        async def act() -> set[str]:
            await controller._turn(view)  # promotes the running starters it trusts
            claimed = await provider.provision(spec("op-claim", template="podtemplate/busy"), lease_seconds=600)
            return promoted | {uid_of(claimed)}

        # Relabelling a starting Pod "warm" (no probe, no promotion) is this world's annotation edit.
        return Attack(core, genuine, act, notes={"edit": {"metadata": {"labels": {POOL_STATE_LABEL: WARM}}}})


# ------------------------------------------------------------------------------------------------ item 2


async def test_a_forged_pod_past_its_lease_is_not_deleted_and_a_sealed_one_is_with_an_event(core: FakeCore) -> None:
    clock = FakeClock(start=time.time())
    provider = provider_on(core, clock)
    genuine = await genuine_pod(core, provider, env={"TOKEN": "t"})
    name, env_secret = genuine["metadata"]["name"], env_secret_of(genuine)
    forged = core.create({**genuine, "metadata": {**genuine["metadata"], "name": "victim"}})
    core.create({"kind": "Secret", "metadata": {"namespace": NS, "name": "victim-env"}})
    clock.advance(3600)  # every lease ran out
    assert await provider.inventory_sandboxes(INSTALLATION) == []
    assert core.get(NS, "victim") is not None and core.secret(NS, "victim-env") is not None
    assert core.warnings(NS, "victim"), "the refusal is said on the forged Pod"
    assert core.get(NS, name) is None and core.secret(NS, env_secret) is None
    assert [e["reason"] for e in core.events if e["involvedObject"]["name"] == name] == ["SandboxPodDeleted"]
    assert ("Pod", f"{NS}/victim", forged["metadata"]["uid"]) not in core.deleted


async def test_a_lease_written_into_the_past_never_gets_a_live_pod_deleted_and_the_backstop_stays(
        core: FakeCore) -> None:
    """A Pod editor rewrites a sealed sandbox Pod's lease annotation to a time long past. A process that never
    leased the Pod (the operator after a restart) neither deletes it when it lists it nor takes it for gone when
    it renews it; one lease (sealed in the Pod's description) after its first sight, with nobody renewing, the
    Pod is deleted all the same; a lease written later (another process's renewal) keeps it longer."""
    clock = FakeClock(start=time.time())
    handle = await provider_on(core, clock).provision(spec(), lease_seconds=600)
    name = handle.metadata["pod"]
    core.patch(NS, name, {"metadata": {"annotations": {"durable-sandbox.dev/lease-expires-at": "1.0"}}})

    restarted = provider_on(core, clock)
    assert [h.id for h in await restarted.inventory_sandboxes(INSTALLATION)] == [handle.id]
    (listed,) = await provider_on(core, clock).list_sandboxes(OWNER)
    assert listed.lease_expires_at == 1.0
    await provider_on(core, clock).renew_lease(listed, 600)  # not gone: the call path believes no less
    assert core.get(NS, name) is not None and not core.deleted

    core.patch(NS, name, {"metadata": {"annotations": {"durable-sandbox.dev/lease-expires-at": "1.0"}}})
    clock.advance(599)
    assert [h.id for h in await restarted.inventory_sandboxes(INSTALLATION)] == [handle.id]
    core.patch(NS, name, {"metadata": {"annotations": {"durable-sandbox.dev/lease-expires-at": repr(clock() + 300)}}})
    clock.advance(2)  # past the first sight's lease, but a renewal wrote a later end
    assert [h.id for h in await restarted.inventory_sandboxes(INSTALLATION)] == [handle.id]
    clock.advance(300)  # nobody renewed it again: the backstop deletes it
    assert await restarted.inventory_sandboxes(INSTALLATION) == []
    assert core.get(NS, name) is None
    assert [e["reason"] for e in core.events if e["involvedObject"]["name"] == name] == ["SandboxPodDeleted"]


async def test_destroy_deletes_the_env_secret_only_while_its_pod_owns_it(core: FakeCore,
                                                                          provider: KubernetesProvider) -> None:
    handle = await provider.provision(spec(env={"TOKEN": "t"}), lease_seconds=600)
    name = handle.metadata["pod"]
    env_secret = env_secret_of(core.get(NS, name))
    # A user replaces the Secret beside the Pod with one of her own (no owner): it is not the sandbox's.
    core.secrets.pop((NS, env_secret))
    core.create({"kind": "Secret", "metadata": {"namespace": NS, "name": env_secret}})
    await provider.destroy(handle)
    assert core.get(NS, name) is None
    assert core.secret(NS, env_secret) is not None


async def test_destroying_a_recorded_sandbox_never_deletes_a_pod_recreated_under_its_name(
        core: FakeCore, provider: KubernetesProvider) -> None:
    handle = await provider.provision(spec(), lease_seconds=600)
    name = handle.metadata["pod"]
    original = core.get(NS, name)
    assert original is not None
    core.delete(NS, name)
    again = core.create({**original, "metadata": {**original["metadata"]}})
    await provider.destroy(handle)
    assert core.get(NS, name) is not None and core.get(NS, name)["metadata"]["uid"] == again["metadata"]["uid"]


async def test_a_renewal_finds_a_pod_replaced_under_the_same_name_gone(core: FakeCore,
                                                                        provider: KubernetesProvider) -> None:
    from durable_sandbox.providers.contract import SandboxGone

    handle = await provider.provision(spec(), lease_seconds=600)
    name = handle.metadata["pod"]
    original = core.get(NS, name)
    assert original is not None
    core.delete(NS, name)
    core.create({**original, "metadata": {**original["metadata"]}})
    with pytest.raises(SandboxGone, match="replaced"):
        await provider.renew_lease(handle, 600)
    assert core.warnings(NS, name)


async def test_an_unfinished_attempt_is_made_again_and_a_finished_one_adopted(core: FakeCore,
                                                                            provider: KubernetesProvider) -> None:
    """The crash window between a Pod's create and its seal: the retry deletes that Pod (the operator marked it
    for this operation's name) and makes the sandbox again, so nothing half made is ever used."""
    first = await provider.provision(spec(), lease_seconds=600)
    name = first.metadata["pod"]
    pod = core.get(NS, name)
    assert pod is not None
    assert (await provider.provision(spec(), lease_seconds=600)).metadata["uid"] == first.metadata["uid"]
    # Put back what the Pod carried before its seal (its creation mark): the crash window.
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    mark = creation_mark(provider._seal_key, NS, name, labels[OWNER_KEY_LABEL], labels[OPERATION_KEY_LABEL],
                         annotations[META_ANNOTATION])
    core.patch(NS, name, {"metadata": {"annotations": {SEAL: mark}}})
    again = await provider.provision(spec(), lease_seconds=600)
    assert again.metadata["uid"] != first.metadata["uid"]
    assert ("Pod", f"{NS}/{name}", first.metadata["uid"]) in core.deleted


def test_every_forgery_is_in_the_kit() -> None:
    assert set(FORGERIES) == {"planted", "relabelled", "recreated", "annotation_edited"}


async def test_deleting_a_pool_deletes_its_warm_pods_never_a_starting_pod_recreated_with_the_seal(
        core: FakeCore, provider: KubernetesProvider) -> None:
    """A starting Pod's creation seal binds no uid: the pool's cleanup leaves starting Pods to the cluster (they
    are owned by the pool), so a forgery re-created under a starting Pod's name is not deleted by the operator."""
    template = TEMPLATE
    owner = {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "SandboxPool", "name": "busy", "uid": "uid-pool"}
    warm_name = await provider.make_pool_pod(NS, "busy", owner, template)
    warm = core.get(NS, warm_name)
    assert warm is not None and await provider.promote_pool_pod(warm, "busy")
    starting_name = await provider.make_pool_pod(NS, "busy", owner, template)
    starting = core.get(NS, starting_name)
    assert starting is not None
    core.delete(NS, starting_name)
    forged = core.create({**starting, "metadata": {**starting["metadata"]}})
    controller = PoolController(cast(Any, None), lambda: provider, OperatorMetrics(process_collectors=False))
    await controller.cleanup({"metadata": {"namespace": NS, "name": "busy", "uid": "uid-pool"}})
    assert core.get(NS, warm_name) is None
    left = core.get(NS, starting_name)
    assert left is not None and left["metadata"]["uid"] == forged["metadata"]["uid"]


# ------------------------------------------------------------------------------------------------ calls (issue 32 follow-up)


def shell(command: str = "true", **args: Any) -> ToolCall:
    return ToolCall(operation_id="call-1", type="shell", args={"command": command, **args})


def exec_of(provider: KubernetesProvider) -> FakeExec:
    return cast(FakeExec, provider._exec)


@pytest.mark.parametrize("recorded_uid", [True, False], ids=["handle-with-uid", "handle-without-uid"])
async def test_a_call_sends_nothing_to_a_pod_recreated_under_the_sandbox_pods_name(
        core: FakeCore, provider: KubernetesProvider, recorded_uid: bool) -> None:
    """The Pod deleted and made again by a namespace user, labels and annotations (seal included) copied, before
    the next lease renewal: the call's script and env (a Secret's value) never reach it, the sandbox is lost (the
    run restores and replays into a Pod of the operator's), and the forgery is refused visibly, not deleted."""
    handle = await provider.provision(spec(), lease_seconds=600)
    if not recorded_uid:  # a handle journaled without its uid: the operator's seal decides
        handle = handle.model_copy(update={"metadata": {k: v for k, v in handle.metadata.items() if k != "uid"}})
    forged = recreate(core, core.get(NS, handle.metadata["pod"]))
    runs = len(exec_of(provider).runs)
    with pytest.raises(SandboxGone, match="replaced by another Pod of the same name"):
        await provider.execute(handle, shell("echo $TOKEN", env={"TOKEN": "s3cr3t-call-env"}))
    assert len(exec_of(provider).runs) == runs, "an exec was sent to the forged Pod"
    assert not any(b"s3cr3t-call-env" in sent for sent in exec_of(provider).sent)
    assert core.warnings(NS, forged["metadata"]["name"])
    assert core.get(NS, forged["metadata"]["name"])["metadata"]["uid"] == forged["metadata"]["uid"]
    with pytest.raises(SandboxGone):  # and the sandbox stays lost: no later call goes there either
        await provider.execute(handle, shell())


async def test_a_result_from_a_pod_replaced_while_the_call_ran_is_never_used(core: FakeCore,
                                                                             provider: KubernetesProvider) -> None:
    """The exec is by name: a Pod swapped in while it runs (force delete, create) may have answered it. The
    uid read after the exec differs from the one before, so the result is discarded and the sandbox lost."""
    handle = await provider.provision(spec(), lease_seconds=600)
    genuine = core.get(NS, handle.metadata["pod"])
    assert (await provider.execute(handle, shell())).exit_code == 0  # the positive control

    def swap(namespace: str, name: str) -> None:
        exec_of(provider).during = None
        recreate(core, genuine)

    exec_of(provider).during = swap
    with pytest.raises(SandboxGone, match="nor its result used"):
        await provider.execute(handle, shell())
    assert core.warnings(NS, handle.metadata["pod"])


async def test_a_snapshot_of_a_replaced_pod_is_never_stored(core: FakeCore, provider: KubernetesProvider) -> None:
    """Every exec goes through the check, a snapshot's and a restore's too (their data is the sandbox's files)."""
    handle = await provider.provision(spec(), lease_seconds=600)
    recreate(core, core.get(NS, handle.metadata["pod"]))
    with pytest.raises(SandboxGone):
        await provider._run(handle, b"tar", what="snapshot (operation s-1)")
    assert len(exec_of(provider).runs) == 1  # the probe of the genuine Pod only


# ------------------------------------------------------------------------------------------------ env Secret


async def test_an_env_secret_planted_under_the_old_name_receives_nothing_and_is_left_alone(
        core: FakeCore, provider: KubernetesProvider) -> None:
    """Its name was ``<pod>-env`` (the Pod's name comes from the operation id, printed on the Sandbox): a user
    made a Secret there first, with a key of hers, and the sandbox's env was written into it and read from it.
    Now the name is one only the operator computes."""
    handle_spec = spec(env={"TOKEN": "s3cr3t-env"})
    name = pod_name(handle_spec.operation_id or "")
    planted = core.create({"kind": "Secret", "metadata": {"namespace": NS, "name": f"{name}-env"},
                           "stringData": {"LD_PRELOAD": "/workspace/evil.so"}})
    handle = await provider.provision(handle_spec, lease_seconds=600)
    env_secret = env_secret_of(core.get(NS, handle.metadata["pod"]))
    assert env_secret != f"{name}-env" and env_secret.startswith(f"{name}-env-")
    left = core.secret(NS, f"{name}-env")
    assert left is not None and left["metadata"]["uid"] == planted["metadata"]["uid"]
    assert left["stringData"] == {"LD_PRELOAD": "/workspace/evil.so"} and not left["metadata"].get("ownerReferences")
    ours = core.secret(NS, env_secret)
    assert ours is not None and ours["stringData"] == {"TOKEN": "s3cr3t-env"}
    assert [r["uid"] for r in ours["metadata"]["ownerReferences"]] == [handle.metadata["uid"]]
    # The name is the key's: another operator key (or none) names another Secret.
    other = provider_on(FakeCore())
    other._seal_key = b"another key"
    assert env_secret_name(other._seal_key, NS, name) != env_secret


async def test_a_secret_found_under_the_env_secrets_name_is_never_written_into_and_nothing_leaks(
        core: FakeCore, provider: KubernetesProvider) -> None:
    """A retried provision meets the Secret of its name (an earlier attempt's, or a copy made once it was seen):
    it is made anew, never patched (a user's extra key would become the sandbox's env), and the adopted Pod owns
    the new one, so destroying the sandbox leaves no Secret behind."""
    first = await provider.provision(spec(env={"TOKEN": "t"}), lease_seconds=600)
    env_secret = env_secret_of(core.get(NS, first.metadata["pod"]))
    core.delete_secret(NS, env_secret)
    copied = core.create({"kind": "Secret", "metadata": {"namespace": NS, "name": env_secret},
                          "stringData": {"TOKEN": "t", "LD_PRELOAD": "/workspace/evil.so"}})
    again = await provider.provision(spec(env={"TOKEN": "t"}), lease_seconds=600)
    assert again.metadata["uid"] == first.metadata["uid"]  # adopted
    made = core.secret(NS, env_secret)
    assert made is not None and made["metadata"]["uid"] != copied["metadata"]["uid"]
    assert made["stringData"] == {"TOKEN": "t"}
    assert [r["uid"] for r in made["metadata"]["ownerReferences"]] == [first.metadata["uid"]]
    await provider.destroy(again)
    assert core.secret(NS, env_secret) is None and core.get(NS, first.metadata["pod"]) is None


class _BlockedRead(FakeExec):
    """A read_file whose ``head`` never gets its file (code in the sandbox swapped a FIFO in after the script
    checked it was a regular file): its exec answers only once the call's tagged processes are killed."""

    def __init__(self) -> None:
        super().__init__()
        self.killed = asyncio.Event()

    async def run(self, namespace: str, pod: str, container: str, command: Sequence[str], **kwargs: Any) -> ExecOutcome:
        outcome = await super().run(namespace, pod, container, command, **kwargs)
        script = self.sent[-1]
        if b"dsb_kill" in script and b"DSB_CALL=" in script and b"/bin/sh -c" not in script:
            self.killed.set()  # the kill of the call's processes
        elif b"exec cat" in script or b"head -c" in script:
            await self.killed.wait()
            return ExecOutcome(exit_code=137, status={"status": "Failure"})
        return outcome


async def test_a_read_that_never_gets_its_file_is_killed_at_its_deadline_and_says_so(core: FakeCore) -> None:
    """A read_file blocked for ever in the Pod (a FIFO swapped in for the file) would hold the Sandbox's turn, and
    every caller's, for ever: it is killed at the read deadline (its tagged processes, like a shell call's
    timeout) and answered as a failed read saying why."""
    provider = provider_on(core)
    provider._exec = cast(Any, _BlockedRead())
    provider.read_timeout = 0.2
    handle = await provider.provision(spec(), lease_seconds=600)
    result = await asyncio.wait_for(provider.execute(handle, ToolCall(operation_id="r1", type="read_file",
                                                                      args={"path": "trap"})), timeout=30)
    assert result.exit_code == 1
    assert "Cannot read trap: it was not read within 0.2s" in result.stderr
    assert cast(_BlockedRead, provider._exec).killed.is_set()
    await provider.aclose()

"""The kubernetes provider with Pods really running: the contract kit, sandbox sessions (cadence, loss and
replay with a nonzero exit among the replayed calls, retained snapshot, finalize), and bad input and faults.
Snapshots go to a real S3 server (versitygw on loopback).

Runs on the test node (issue 22's ``node_cluster``): the sandbox image is the busybox test image built from the
host's busybox and imported into the node (``DSB_TEST_SANDBOX_IMAGE`` names another already there). A node that
cannot be prepared fails these tests; they are never skipped.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.kube.sweep.orphans import sweep_once
from durable_sandbox.providers.archive_limit import ArchiveTooLarge
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
)
from durable_sandbox.providers.kubernetes import SANDBOX_LABEL, KubernetesProvider
from durable_sandbox.providers.kubernetes_template import PodTemplate
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore, SnapshotName
from durable_sandbox.providers.testing import ProviderContractSuite
from durable_sandbox.testing import FakeClock
from tests.e2e.controlplane import fresh_namespace
from tests.e2e.sandbox_support import IMAGE, control_plane_on_the_node, node
from tests.e2e.trust_node_support import NODE_HOSTILE_SPEC, KubectlCluster
from tests.objectstore import S3Server
from tests.unit.sandbox_session_support import SESSION_CALLS as CALLS
from tests.unit.sandbox_session_support import engine_for
from tests.unit.trust_support import FORGERIES, Attack, TrustKit

from .controlplane import ControlPlane
from .node_support import NodeCluster, require_gvisor

__all__ = ["control_plane_on_the_node", "node"]  # fixtures

NO_SHELL_IMAGE = os.environ.get("DSB_TEST_NO_SHELL_IMAGE", "localhost/pause:3.10")  # FROM scratch: no /bin/sh


@pytest.fixture
def namespace(control_plane: ControlPlane, node: str) -> Iterator[str]:
    with fresh_namespace(control_plane, "kpn") as name:
        yield name
        leftover = control_plane.kubectl_json("get", "pods", "-n", name, "-l", f"{SANDBOX_LABEL}=true")["items"]
    assert [p["metadata"]["name"] for p in leftover if not p["metadata"].get("deletionTimestamp")] == [], \
        "the test left sandbox Pods behind"


@pytest.fixture
async def store(s3_server: S3Server) -> AsyncIterator[S3SnapshotStore]:
    store = S3SnapshotStore(s3_server.config("kpn-" + secrets.token_hex(4), prefix="snapshots"))
    await store.ensure_bucket()
    yield store
    await store.aclose()


def make_provider(cp: ControlPlane, namespace: str, store: S3SnapshotStore | None, **kwargs: Any) -> KubernetesProvider:
    return KubernetesProvider(kubeconfig=str(cp.kubeconfig), namespace=namespace, environ={},
                              template=kwargs.pop("template", PodTemplate(image=IMAGE, imagePullPolicy="Never")),
                              store=store, **kwargs)


async def stored_objects(store: S3SnapshotStore) -> list[str]:
    s3 = await store._s3()
    answer = await s3.list_objects_v2(Bucket=store.config.bucket)
    return [o["Key"] for o in answer.get("Contents", []) or []]


class TestKubernetesContract(ProviderContractSuite):
    # busybox's tar writes the holes out; the provider's limit here is 16 MiB (a smaller archive to stream).
    oversized_workspace = "truncate -s 2G holes"

    @pytest.fixture
    async def provider(self, control_plane: ControlPlane, namespace: str,
                       store: S3SnapshotStore) -> AsyncIterator[SandboxProvider]:
        self.cp, self.clock = control_plane, FakeClock()
        provider = make_provider(control_plane, namespace, store, clock=self.clock, snapshot_limit=16 * 2**20)
        yield provider
        await provider.aclose()

    async def lose(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        namespace, name = handle.id.split("/")
        # Gone from the API at once, as after an eviction whose Pod object was removed.
        self.cp.kubectl("delete", "pod", "-n", namespace, name, "--grace-period=0", "--force")

    async def expire_lease(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        self.clock.advance(self.lease_seconds + 1)


class TestKubernetesContractUnderGVisor(TestKubernetesContract):
    """The same contract with every sandbox Pod under gVisor (RuntimeClass ``gvisor`` on the test node): calls,
    files, snapshots and restores, loss and leases behave the same when the sandbox's kernel is gVisor's."""

    @pytest.fixture
    async def provider(self, control_plane: ControlPlane, namespace: str,
                       store: S3SnapshotStore) -> AsyncIterator[SandboxProvider]:
        assert isinstance(control_plane, NodeCluster)
        runtime_class = require_gvisor(control_plane)
        self.cp, self.clock = control_plane, FakeClock()
        template = PodTemplate(image=IMAGE, imagePullPolicy="Never", runtimeClassName=runtime_class)
        provider = make_provider(control_plane, namespace, store, clock=self.clock, template=template,
                                 snapshot_limit=16 * 2**20)
        yield provider
        await provider.aclose()


# ------------------------------------------------------------------------------------------- calls


@pytest.fixture
async def provider(control_plane: ControlPlane, namespace: str,
                   store: S3SnapshotStore) -> AsyncIterator[KubernetesProvider]:
    provider = make_provider(control_plane, namespace, store)
    yield provider
    await provider.aclose()


def spec(namespace: str, **fields: Any) -> SandboxSpec:
    return SandboxSpec(owner=f"{namespace}/owner-uid", operation_id="op-" + secrets.token_hex(6), **fields)


async def call(provider: KubernetesProvider, handle: SandboxHandle, type_: str, **args: Any) -> Any:
    return await provider.execute(handle, ToolCall(operation_id="c-" + secrets.token_hex(4), type=type_, args=args))


async def test_a_timeout_kills_the_calls_processes_in_the_pod(provider: KubernetesProvider, namespace: str) -> None:
    handle = await provider.provision(spec(namespace), lease_seconds=600)
    try:
        result = await call(provider, handle, "shell", command="echo started; sleep 300 & setsid sleep 301 & wait",
                            timeout=2)
        assert result.exit_code == 124 and result.stdout == "started\n"
        assert result.stderr.endswith("Command timed out after 2 seconds")
        # By argument: the Pod's keep-alive loop has a sleep of its own.
        left = await call(provider, handle, "shell", command="ps -o args | grep -c 'sleep 30[01]' || true")
        assert left.stdout.strip() == "0", "the timed-out call's processes were killed, also the setsid one"
    finally:
        await provider.destroy(handle)


async def test_big_output_is_kept_head_and_tail_and_binary_files_round_trip(provider: KubernetesProvider,
                                                                           namespace: str) -> None:
    handle = await provider.provision(spec(namespace), lease_seconds=600)
    try:
        result = await call(provider, handle, "shell", command="head -c 5000000 /dev/zero | tr '\\0' a")
        assert result.stdout_size == 5_000_000 and "output truncated" in result.stdout
        # 119,010 bytes: beyond one exec frame, within what a result keeps whole (head and tail of 64 KiB each).
        text = "".join(chr(c) for c in range(1, 0x800)) * 30
        await call(provider, handle, "write_file", path="d/u.txt", contents=text)
        assert (await call(provider, handle, "read_file", path="d/u.txt")).stdout == text
    finally:
        await provider.destroy(handle)


# ------------------------------------------------------------------------------------------- faults


async def test_bad_images_fail_the_provision_saying_why_and_leave_no_pod(control_plane: ControlPlane, namespace: str,
                                                                         provider: KubernetesProvider) -> None:
    for image, reason in (("localhost/no-such-image:1", "ErrImageNeverPull"), (NO_SHELL_IMAGE, "/bin/sh")):
        with pytest.raises(ProvisionError) as failed:
            await provider.provision(spec(namespace, template=image), lease_seconds=600)
        assert reason in str(failed.value) and failed.value.retryable is False, str(failed.value)
    pods = control_plane.kubectl_json("get", "pods", "-n", namespace)["items"]
    assert [p for p in pods if not p["metadata"].get("deletionTimestamp")] == []


async def test_a_privileged_pod_template_is_refused_before_any_pod(control_plane: ControlPlane, namespace: str,
                                                                   provider: KubernetesProvider) -> None:
    control_plane.apply({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "priv", "namespace": namespace},
                         "template": {"spec": {"containers": [{"name": "c", "image": IMAGE,
                                                               "securityContext": {"privileged": True}}]}}})
    with pytest.raises(ProvisionError, match=r"securityContext\.privileged"):
        await provider.provision(spec(namespace, template="podtemplate/priv"), lease_seconds=600)
    assert control_plane.kubectl_json("get", "pods", "-n", namespace)["items"] == []


async def test_a_pod_deleted_mid_call_is_sandbox_gone(control_plane: ControlPlane, namespace: str,
                                                      provider: KubernetesProvider) -> None:
    handle = await provider.provision(spec(namespace), lease_seconds=600)
    running = asyncio.ensure_future(call(provider, handle, "shell", command="sleep 300"))
    namespace_, name = handle.id.split("/")
    control_plane.kubectl("delete", "pod", "-n", namespace_, name, "--grace-period=0", "--force")
    with pytest.raises(SandboxGone):
        await asyncio.wait_for(running, 120)
    await provider.destroy(handle)


async def test_a_store_that_is_down_fails_the_snapshot_retryably_and_leaves_no_object(
        s3_server: S3Server, store: S3SnapshotStore, provider: KubernetesProvider, namespace: str) -> None:
    handle = await provider.provision(spec(namespace), lease_seconds=600)
    try:
        await call(provider, handle, "write_file", path="a.txt", contents="a")
        s3_server.stop()
        try:
            with pytest.raises(ProviderError) as failed:
                await provider.snapshot(handle, operation_id="snap-down")
            assert failed.value.retryable is True and s3_server.secret_key not in str(failed.value)
        finally:
            s3_server.start()
        snapshot = await provider.snapshot(handle, operation_id="snap-down")  # the same operation, once it is back
        name = SnapshotName.parse(snapshot)
        assert name is not None and await stored_objects(store) == [store.key(name)]
        await provider.delete_snapshot(snapshot)
        assert await stored_objects(store) == []
    finally:
        await provider.destroy(handle)


async def test_a_sparse_file_fails_the_snapshot_at_the_limit_and_a_restore_never_writes_past_it(
        control_plane: ControlPlane, store: S3SnapshotStore, namespace: str) -> None:
    """Issue 32, item 4: `truncate -s 2G` made a snapshot upload 2 GiB. The test image's tar (busybox) cannot keep
    a sparse file sparse, so the archive limit stops it: the snapshot fails naming the limit, nothing is stored,
    and the sandbox and provider go on. A restore of an archive over the limit makes no Pod at all."""
    limited = make_provider(control_plane, namespace, store, snapshot_limit=16 * 2**20)
    roomy = make_provider(control_plane, namespace, store, snapshot_limit=64 * 2**20)
    handle = await limited.provision(spec(namespace), lease_seconds=600)
    try:
        made = await call(limited, handle, "shell", command="truncate -s 2G holes && du -k holes && ls -l holes")
        assert made.exit_code == 0 and "2147483648" in made.stdout, made
        with pytest.raises(ArchiveTooLarge) as failed:
            await asyncio.wait_for(limited.snapshot(handle, operation_id="snap-sparse"), 120)
        assert "larger than the limit of 16 MiB" in str(failed.value) and failed.value.retryable is False
        assert await stored_objects(store) == [], "the upload was aborted: nothing past the limit is stored"
        assert (await call(limited, handle, "shell", command="rm holes && head -c 20000000 /dev/urandom > big"
                           )).exit_code == 0, "the sandbox is still there"
        big = await roomy.snapshot(handle, operation_id="snap-big")  # 20 MB: within the roomy provider's limit
    finally:
        await limited.destroy(handle)
    try:
        before = {p["metadata"]["name"] for p in control_plane.kubectl_json("get", "pods", "-n", namespace)["items"]}
        with pytest.raises(ArchiveTooLarge, match=f"restore of snapshot {big}: .*16 MiB"):
            await limited.restore(big, spec(namespace), lease_seconds=600)
        after = {p["metadata"]["name"] for p in control_plane.kubectl_json("get", "pods", "-n", namespace)["items"]}
        assert after <= before, "the restore was refused before any Pod was made"
    finally:
        await roomy.delete_snapshot(big)
        await limited.aclose()
        await roomy.aclose()


# ------------------------------------------------------------------------------------------- sessions

AGENT = "sandbox-agent"


@pytest.fixture
async def engine(tmp_path: Path, provider: KubernetesProvider) -> AsyncIterator[durable_sandbox.Engine]:
    e = engine_for(tmp_path / "runs.db", {"kubernetes": provider})
    yield e
    await e.aclose()


def outcomes(state: durable_sandbox.RunState) -> list[tuple[int, str, str]]:
    return [(r["exitCode"], r["stdout"], r["stderr"]) for r in state.result["toolResults"]]


def agent(calls: list[dict[str, Any]], namespace: str, **options: Any) -> dict[str, Any]:
    return {"toolCalls": calls, "sandbox": {"provider": "kubernetes", "leaseSeconds": 600}, **options}


async def test_sessions_cadence_loss_with_replay_retain_and_finalize(
        engine: durable_sandbox.Engine, store: S3SnapshotStore, provider: KubernetesProvider, namespace: str,
        control_plane: ControlPlane) -> None:
    plain = await engine.run(AGENT, agent(CALLS, namespace), run_id="k-plain")
    assert plain.status == "succeeded", plain.error
    expected = outcomes(plain)
    assert expected[2][0] != 0, "the nonzero exit is a result"
    lost = await engine.run(AGENT, agent(CALLS, namespace, snapshotEveryNCalls=2, injectLossAfterNCalls=3),
                            run_id="k-lost")
    assert lost.status == "succeeded", lost.error
    assert outcomes(lost) == expected, "restore of the newest snapshot and replay give the same outcomes"
    assert lost.recovery_count == 1
    assert await stored_objects(store) == [], "finalize deleted every snapshot"
    kept = await engine.run(AGENT, agent(CALLS[:2], namespace, snapshotEveryNCalls=1, retainLatestSnapshot=True),
                            run_id="k-kept")
    assert kept.status == "succeeded", kept.error
    latest = SnapshotName.parse(kept.result["latestSnapshot"])
    assert latest is not None and await stored_objects(store) == [store.key(latest)], "only the retained one"
    restored = await provider.restore(kept.result["latestSnapshot"], spec(namespace), lease_seconds=60)
    assert (await call(provider, restored, "read_file", path="a.txt")).stdout == "hello\nmore\n"
    await provider.destroy(restored)
    await provider.delete_snapshot(kept.result["latestSnapshot"])
    pods = control_plane.kubectl_json("get", "pods", "-n", namespace, "-l", f"{SANDBOX_LABEL}=true")["items"]
    assert [p for p in pods if not p["metadata"].get("deletionTimestamp")] == [], "no Pod outlives its run"


# ------------------------------------------------------------------------------------------- isolation


async def test_a_gvisor_template_runs_the_sandbox_under_gvisor_and_its_handle_says_so(
        control_plane: ControlPlane, namespace: str, store: S3SnapshotStore) -> None:
    assert isinstance(control_plane, NodeCluster)
    runtime_class = require_gvisor(control_plane)
    template = PodTemplate(image=IMAGE, imagePullPolicy="Never", runtimeClassName=runtime_class)
    provider = make_provider(control_plane, namespace, store, template=template)
    plain = make_provider(control_plane, namespace, store)
    try:
        handle = await provider.provision(spec(namespace), lease_seconds=600)
        other = await plain.provision(spec(namespace), lease_seconds=600)
        try:
            assert handle.metadata["runtimeClassName"] == runtime_class
            assert "runtimeClassName" not in other.metadata
            # gVisor's Sentry keeps its own kernel log; under runc dmesg reaches the host's and is refused.
            kernel = await call(provider, handle, "shell", command="dmesg")
            assert kernel.exit_code == 0 and "Starting gVisor" in kernel.stdout, kernel
            host = await call(plain, other, "shell", command="dmesg")
            assert host.exit_code != 0 and "Starting gVisor" not in host.stdout, host
            # The handle says what the cluster made: the Pod's own field.
            namespace_, name = handle.id.split("/")
            pod = control_plane.kubectl_json("get", "pod", "-n", namespace_, name)
            assert pod["spec"]["runtimeClassName"] == runtime_class
        finally:
            await provider.destroy(handle)
            await plain.destroy(other)
    finally:
        await provider.aclose()
        await plain.aclose()


async def test_a_runtime_class_the_cluster_lacks_fails_the_provision_naming_it(
        control_plane: ControlPlane, namespace: str) -> None:
    template = PodTemplate(image=IMAGE, imagePullPolicy="Never", runtimeClassName="kata-missing")
    provider = make_provider(control_plane, namespace, None, template=template)
    try:
        with pytest.raises(ProvisionError) as caught:
            await provider.provision(spec(namespace), lease_seconds=600)
        assert caught.value.retryable is False
        message = str(caught.value)
        assert 'RuntimeClass "kata-missing" not found' in message and "kubectl get runtimeclass" in message
        assert "RBAC" not in message
    finally:
        await provider.aclose()
    pods = control_plane.kubectl_json("get", "pods", "-n", namespace, "-l", f"{SANDBOX_LABEL}=true")["items"]
    assert pods == [], "no Pod was made"


async def test_the_isolation_benchmark_runs_at_its_smallest(control_plane: ControlPlane, namespace: str) -> None:
    """benchmarks/kubernetes_provider.py's isolation part (docs/benchmarks.md), once, so that it does not rot."""
    bench = _benchmark("kubernetes_provider")
    assert isinstance(control_plane, NodeCluster)
    runtime_class = require_gvisor(control_plane)
    plain = make_provider(control_plane, namespace, None)
    isolated = make_provider(control_plane, namespace, None, template=PodTemplate(
        image=IMAGE, imagePullPolicy="Never", runtimeClassName=runtime_class))
    try:
        figures = await bench.isolation_part(plain, isolated, namespace, repeats=1)
    finally:
        await plain.aclose()
        await isolated.aclose()
    assert figures["startup_ratio"] > 0 and figures["call_ratio"] > 0
    assert len(figures["samples"]["isolated_call"]) == 3


def _benchmark(name: str) -> Any:
    directory = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return importlib.import_module(name)


# ------------------------------------------------------------------------ the trust kit with real Pods (issue 32)

TRUST_OWNER_UID = "uid-trust-owner"


def trust_spec(namespace: str, operation: str = "op-trust", **fields: Any) -> SandboxSpec:
    return SandboxSpec(owner=f"{namespace}/{TRUST_OWNER_UID}", operation_id=operation, **fields,
                       labels={INSTALLATION_LABEL: f"inst-{namespace}", "durable-sandbox.dev/operation": operation})


class NodeTrustWorld:
    """A real provider, its genuine Pod running on the node, the forgeries running there too (the node's image,
    the host's network); every Pod is removed after the test (forgeries are, by design, left by the operator)."""

    act_on: str = ""

    @pytest.fixture
    async def world(self, control_plane: ControlPlane, namespace: str) -> AsyncIterator[Attack]:
        provider = make_provider(control_plane, namespace, None)
        handle = await provider.provision(trust_spec(namespace, env={"TOKEN": "t"}), lease_seconds=600)
        cluster = KubectlCluster(control_plane)
        genuine = cluster.get(namespace, handle.metadata["pod"])
        assert genuine is not None
        owner, installation = f"{namespace}/{TRUST_OWNER_UID}", f"inst-{namespace}"

        async def act() -> set[str]:
            if self.act_on == "listings":
                listed = [*await provider.list_sandboxes(owner), *await provider.inventory_sandboxes(installation)]
                return {str(h.metadata["uid"]) for h in listed}
            if self.act_on == "retry":
                try:
                    again = await provider.provision(trust_spec(namespace, env={"TOKEN": "t"}), lease_seconds=600)
                except ProvisionError as refused:
                    assert "is not the operator's" in str(refused)
                    return set()
                return {str(again.metadata["uid"])}
            result = await sweep_once(provider, installation=installation, live={}, first_seen={}, now=time.time(),
                                      grace=0)
            return {str(o.handle.metadata["uid"]) for o in result.destroyed if o.handle is not None}

        meets = frozenset({"recreated", "annotation_edited"}) if self.act_on == "retry" else frozenset(FORGERIES)
        try:
            yield Attack(cluster, genuine, act, meets=meets, genuine_used=self.act_on != "sweep",
                         hostile=NODE_HOSTILE_SPEC)
        finally:
            await provider.aclose()
            control_plane.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force",
                                  "--wait=true", timeout=120)


class TestTrustKitListingsOnTheNode(NodeTrustWorld, TrustKit):
    """list_sandboxes (what a Sandbox adopts and destroys) and the inventory: only Pods sealed over their uid."""

    act_on = "listings"


class TestTrustKitRetriedProvisionOnTheNode(NodeTrustWorld, TrustKit):
    """A retried provision adopts the Pod under its operation's name only if the operator sealed it (item 1)."""

    act_on = "retry"


class TestTrustKitOrphanSweepOnTheNode(NodeTrustWorld, TrustKit):
    """The orphan sweep deletes its own orphaned Pod (and its env Secret), never a forged one (item 2)."""

    act_on = "sweep"

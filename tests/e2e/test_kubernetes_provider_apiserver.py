"""The kubernetes provider against the real API server, for what needs no kubelet: the exec handshake and its
refusals, templates refused before any Pod exists, PodTemplate objects, and a Pod that never runs deleted
with a provision error that says why. Pods really running (calls, snapshots, the contract kit) are the node's
tests (tests/e2e/test_kubernetes_provider_node.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from durable_sandbox.providers.contract import ProvisionError, SandboxSpec
from durable_sandbox.providers.kubernetes import SANDBOX_LABEL, KubernetesProvider, pod_name
from durable_sandbox.providers.kubernetes_exec import ExecRejected, PodExec
from durable_sandbox.providers.kubernetes_identity import env_secret_name
from durable_sandbox.providers.kubernetes_template import PodTemplate
from tests.e2e.controlplane import fresh_namespace
from tests.unit.process_support import eventually

from .controlplane import ControlPlane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(control_plane, "kprov") as name:
        yield name


@pytest.fixture
async def provider(control_plane: ControlPlane, namespace: str) -> AsyncIterator[KubernetesProvider]:
    provider = KubernetesProvider(kubeconfig=str(control_plane.kubeconfig), namespace=namespace, environ={},
                                  ready_timeout=3, unschedulable_grace=1)
    yield provider
    await provider.aclose()


def pods(cp: ControlPlane, namespace: str) -> list[str]:
    return [p["metadata"]["name"] for p in cp.kubectl_json("get", "pods", "-n", namespace)["items"]]


async def test_exec_handshake_refusals_are_told_apart(control_plane: ControlPlane, namespace: str,
                                                      provider: KubernetesProvider) -> None:
    await provider._api()
    execs = PodExec(provider._api_client)
    with pytest.raises(ExecRejected) as missing:
        await execs.run(namespace, "no-such-pod", "sandbox", ["true"], stdout=print, stderr=print)
    assert missing.value.status == 404 and not missing.value.retryable
    # A Pod no node runs: the API server refuses to upgrade (no host to stream from).
    control_plane.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "idle", "namespace": namespace},
                         "spec": {"containers": [{"name": "sandbox", "image": "busybox"}]}})
    with pytest.raises(ExecRejected) as unscheduled:
        await execs.run(namespace, "idle", "sandbox", ["true"], stdout=print, stderr=print)
    assert unscheduled.value.status == 400


async def test_exec_without_the_right_is_forbidden(control_plane: ControlPlane, namespace: str,
                                                   provider: KubernetesProvider) -> None:
    await provider._api()
    provider._api_client.set_default_header("Impersonate-User", "system:serviceaccount:default:nobody")
    execs = PodExec(provider._api_client)
    with pytest.raises(ExecRejected) as forbidden:
        await execs.run(namespace, "any", "sandbox", ["true"], stdout=print, stderr=print)
    assert forbidden.value.status == 403


@pytest.mark.parametrize(("verbs", "status"), [(["create", "get"], 400), (["create"], 403), (["get"], 403)])
async def test_exec_over_websocket_needs_create_on_pods_exec(control_plane: ControlPlane, namespace: str,
                                                             provider: KubernetesProvider, verbs: list[str],
                                                             status: int) -> None:
    """What the chart grants is what the upgrade is authorized as: get (the WebSocket's GET) and create (the
    API server's check for upgrades to exec); 400 here is past authorization (the Pod has no node)."""
    control_plane.kubectl("create", "serviceaccount", "execer", "-n", namespace)
    control_plane.kubectl("create", "role", "execer", "-n", namespace, *[f"--verb={v}" for v in verbs],
                          "--resource=pods/exec")
    control_plane.kubectl("create", "rolebinding", "execer", "-n", namespace, "--role=execer",
                          f"--serviceaccount={namespace}:execer")
    control_plane.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "idle", "namespace": namespace},
                         "spec": {"containers": [{"name": "sandbox", "image": "busybox"}]}})
    await provider._api()
    provider._api_client.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:execer")
    execs = PodExec(provider._api_client)

    async def attempt() -> int:
        try:
            await execs.run(namespace, "idle", "sandbox", ["true"], stdout=print, stderr=print)
        except ExecRejected as exc:
            return exc.status
        return 0

    await eventually_async(attempt, status, "RBAC to settle")


async def eventually_async(attempt: Callable[[], Awaitable[int]], expected: int, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while (got := await attempt()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"{what}: got {got}, expected {expected}"
        await asyncio.sleep(0.2)


async def test_a_refused_template_makes_no_pod(control_plane: ControlPlane, namespace: str,
                                               provider: KubernetesProvider) -> None:
    control_plane.apply({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "root", "namespace": namespace},
                         "template": {"spec": {"hostPID": True, "containers": [{
                             "name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}})
    with pytest.raises(ProvisionError) as refused:
        await provider.provision(SandboxSpec(template="podtemplate/root", owner=f"{namespace}/uid-1",
                                             operation_id="op-refused"), lease_seconds=60)
    text = str(refused.value)
    assert refused.value.retryable is False
    assert "PodTemplate root" in text and "securityContext.privileged" in text and "hostPID" in text
    with pytest.raises(ProvisionError, match="there is no PodTemplate absent in namespace"):
        await provider.provision(SandboxSpec(template="podtemplate/absent", owner=f"{namespace}/uid-1"), lease_seconds=60)
    assert pods(control_plane, namespace) == []


# Issue 32, item 5: each of these became a sandbox Pod before the policy was an allow-list (a PodTemplate's
# serviceAccountName comes back from the API server with the deprecated serviceAccount beside it).
REFUSED_POD_TEMPLATES = {
    "token": ({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}, {},
              "volumes[t].projected.sources[0].serviceAccountToken"),
    "secret": ({"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}, {}, "volumes[s].secret"),
    "apparmor": ({}, {"appArmorProfile": {"type": "Unconfined"}}, "securityContext.appArmorProfile"),
    "selinux": ({}, {"seLinuxOptions": {"type": "spc_t"}}, "securityContext.seLinuxOptions.type"),
    "root": ({}, {"runAsUser": 0}, "securityContext.runAsUser"),
    "account": ({"serviceAccountName": "default"}, {}, "spec.serviceAccountName"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_POD_TEMPLATES))
async def test_the_policy_refuses_what_is_not_on_its_allow_list(control_plane: ControlPlane, namespace: str,
                                                                provider: KubernetesProvider, case: str) -> None:
    spec, security, field = REFUSED_POD_TEMPLATES[case]
    control_plane.apply({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": case, "namespace": namespace},
                         "template": {"spec": {**spec, "containers": [{
                             "name": "c", "image": "busybox", "securityContext": security}]}}})
    with pytest.raises(ProvisionError) as refused:
        await provider.provision(SandboxSpec(template=f"podtemplate/{case}", owner=f"{namespace}/uid-1",
                                             operation_id=f"op-{case}"), lease_seconds=60)
    assert refused.value.retryable is False
    assert f"PodTemplate {case}" in str(refused.value) and field in str(refused.value), str(refused.value)
    assert pods(control_plane, namespace) == []


def test_namespace_roles_cannot_write_pod_templates(control_plane: ControlPlane, namespace: str) -> None:
    """What docs/guarantees.md says of PodTemplates (issue 32, item 8): the built-in edit and admin roles of this
    Kubernetes release grant no write on them, so their writers are whoever was granted PodTemplates by name."""
    for role in ("edit", "admin"):
        user = f"{role}-user"
        control_plane.kubectl("create", "rolebinding", f"{role}-binding", "-n", namespace, f"--clusterrole={role}",
                              f"--user={user}")

        def can(verb: str, resource: str, who: str = user) -> bool:
            out = control_plane.kubectl("auth", "can-i", verb, resource, "-n", namespace, "--as", who, check=False)
            return out.stdout.strip() == "yes"

        control_plane.wait_until(lambda: can("create", "pods"), 30, f"the {role} RoleBinding to take effect")
        for verb in ("create", "update", "patch", "delete"):
            assert not can(verb, "podtemplates"), f"{role} may {verb} podtemplates"


async def test_a_pod_that_never_runs_is_deleted_with_its_env_secret(control_plane: ControlPlane, namespace: str,
                                                                    provider: KubernetesProvider) -> None:
    secret_value = "s3cr3t-" + uuid.uuid4().hex
    spec = SandboxSpec(owner=f"{namespace}/uid-2", operation_id="op-never", env={"TOKEN": secret_value},
                       labels={"durable-sandbox.dev/run-id": "run-1"})
    with pytest.raises(ProvisionError) as failed:
        await provider.provision(spec, lease_seconds=60)
    assert "was not running after 3s" in str(failed.value) and failed.value.retryable is True
    assert secret_value not in str(failed.value)

    def gone() -> bool:
        return not pods(control_plane, namespace) and not [
            s for s in control_plane.kubectl_json("get", "secrets", "-n", namespace)["items"]
            if s["metadata"]["name"].startswith("dsb-")]

    control_plane.wait_until(gone, 30, "the Pod and its env Secret to be deleted")


async def test_the_pod_is_named_from_the_operation_and_says_whose_it_is(
        control_plane: ControlPlane, namespace: str, provider: KubernetesProvider, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="durable_sandbox.providers.kubernetes")
    provider.ready_timeout = 600
    spec = SandboxSpec(owner=f"{namespace}/uid-3", operation_id="op-named", env={"A": "b"},
                       labels={"durable-sandbox.dev/installation": "inst-1", "durable-sandbox.dev/run-id": "run-9"})
    task = asyncio.ensure_future(provider.provision(spec, lease_seconds=60))
    name = pod_name("op-named")
    await eventually(lambda: name in pods(control_plane, namespace), "the Pod to be created", 120)
    pod = control_plane.kubectl_json("get", "pod", "-n", namespace, name)
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[SANDBOX_LABEL] == "true" and labels["durable-sandbox.dev/run-id"] == "run-9"
    assert json.loads(annotations["durable-sandbox.dev/sandbox"])["owner"] == f"{namespace}/uid-3"
    spec_json = json.dumps(pod["spec"])
    assert "b" not in [e.get("value") for e in pod["spec"]["containers"][0].get("env", [])]
    env_secret = env_secret_name(provider._seal_key, namespace, name)  # only the operator's key names it
    assert env_secret.startswith(f"{name}-env-")
    assert pod["spec"]["containers"][0]["envFrom"] == [{"secretRef": {"name": env_secret}}]
    assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountToken" not in spec_json
    secret = control_plane.kubectl_json("get", "secret", "-n", namespace, env_secret)
    await eventually(lambda: control_plane.kubectl_json("get", "secret", "-n", namespace, env_secret)
                     ["metadata"].get("ownerReferences"), "the env Secret to be owned by its Pod", 120)
    assert secret["metadata"]["labels"][SANDBOX_LABEL] == "true"
    # A second provision of the same operation (an answer lost) never adopts a Pod that was not finished (sealed
    # over its uid: this one never runs): it deletes that one, saying so, and makes the Pod again, same name.
    first_uid = pod["metadata"]["uid"]
    again = asyncio.ensure_future(provider.provision(spec, lease_seconds=60))
    await eventually(lambda: "never finished" in caplog.text, "the second provision to replace the Pod", 120)

    def replaced() -> bool:
        found = control_plane.kubectl_json("get", "pods", "-n", namespace)["items"]
        return [(p["metadata"]["name"], p["metadata"]["uid"] != first_uid) for p in found] == [(name, True)]

    await eventually(replaced, "one Pod of that name, a new one", 120)
    assert "adopting Pod" not in caplog.text
    for t in (task, again):
        t.cancel()
    await asyncio.gather(task, again, return_exceptions=True)
    await eventually(lambda: not pods(control_plane, namespace), "the cancelled provision's Pod to go", 180)


def test_the_default_template_is_what_the_operator_configures() -> None:
    configured = KubernetesProvider(environ={"DSB_K8S_TEMPLATE": json.dumps({"image": "localhost/sandbox:1"})})
    assert configured.template == PodTemplate(image="localhost/sandbox:1")
    assert not configured.capabilities().supports("snapshot")  # type: ignore[arg-type]

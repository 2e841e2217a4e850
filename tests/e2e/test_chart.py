"""The Helm chart (charts/durable-sandbox), rendered, linted and installed with the real helm.

Rendering: `helm lint --strict` and `helm template` for the default values and for a namespaced,
multi-replica, metrics-on set (tests/e2e/chart-values/namespaced.yaml), with assertions on what matters
(restricted securityContext, the liveness probe, RBAC scope per watchNamespaces); bad values are refused
by values.schema.json with the key named.

Installing: on a fresh control plane of its own (so that what `helm install` creates, and what
`helm uninstall` leaves, is all the chart's doing): CRDs, ServiceAccount, RBAC, Deployment, Service;
`helm upgrade`; `helm uninstall` leaves the CRDs and nothing else. RBAC is proven least-privilege for the
chart's ServiceAccount both with `kubectl auth can-i --as=...` and with real requests that the API server
denies.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_sandbox.providers.kubernetes_template import PodTemplate, TemplatePolicy

from .controlplane import ControlPlane, private_control_plane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "durable-sandbox"
VALUES = Path(__file__).resolve().parent / "chart-values"
RELEASE = "dsb"
OPERATOR_NS = "durable-sandbox-system"
SA_NAME = "dsb-durable-sandbox"


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    # Private helm state; the cluster is always named explicitly.
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def run_helm(
    helm: Path, home: Path, *args: str, kubeconfig: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, env=helm_env(home, kubeconfig), timeout=180, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def kube_version() -> str:
    from .controlplane import kubernetes_version

    return kubernetes_version()


def render(helm: Path, home: Path, *args: str) -> list[dict[str, Any]]:
    out = run_helm(
        helm, home, "template", RELEASE, str(CHART), "-n", OPERATOR_NS, "--kube-version", kube_version(), *args
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = by_kind(docs, kind)
    return doc


def rules_by_resource(role: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = f"{resource}.{group}" if group else resource
                if "resourceNames" in rule:
                    key += "[" + ",".join(rule["resourceNames"]) + "]"
                out.setdefault(key, set()).update(rule["verbs"])
    return out


# The kubernetes provider's, in a watched namespace's Role only (never in a ClusterRole).
SANDBOX_POD_RULES = {
    "pods": {"get", "list", "watch", "create", "patch", "delete"},
    "pods/exec": {"get", "create"},
    "pods/log": {"get"},
    "secrets": {"create", "patch", "delete"},
    "podtemplates": {"get"},
}

# What the operator uses, and nothing else (docs/operations.md explains each line).
EXPECTED_RULES = {
    "workflows.durable-sandbox.dev": {"get", "list", "watch", "patch", "delete", "create"},  # create: schedules' ticks, child workflows
    "sandboxes.durable-sandbox.dev": {"get", "list", "watch", "patch", "delete"},
    "workflows/status.durable-sandbox.dev": {"get", "patch", "update"},
    "sandboxes/status.durable-sandbox.dev": {"get", "patch", "update"},
    "workflows/finalizers.durable-sandbox.dev": {"update"},
    "sandboxes/finalizers.durable-sandbox.dev": {"update"},
    "journals.durable-sandbox.dev": {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"},
    "sandboxpools.durable-sandbox.dev": {"get", "list", "watch", "patch"},
    "sandboxpools/status.durable-sandbox.dev": {"get", "patch"},
    "workflowschedules.durable-sandbox.dev": {"get", "list", "watch", "patch"},
    "workflowschedules/status.durable-sandbox.dev": {"get", "patch"},
    "workflowschedules/finalizers.durable-sandbox.dev": {"update"},
    "events": {"create", "patch"},
    "events.events.k8s.io": {"create", "patch"},
}


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


# ----------------------------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("values", [None, "namespaced.yaml"], ids=["default", "namespaced-ha-metrics"])
def test_lint_strict(helm: Path, helm_home: Path, values: str | None) -> None:
    args = ["-f", str(VALUES / values)] if values else []
    proc = run_helm(helm, helm_home, "lint", "--strict", str(CHART), *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_default_values_render_a_restricted_cluster_wide_operator(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted([
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ]), "default values: one Role (the journal key's), no PodDisruptionBudget (1 replica), no ServiceMonitor"
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "durable-sandbox"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"

    deploy = one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 1
    assert pod["serviceAccountName"] == SA_NAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["image"] == "durable-sandbox:0.1.0"
    assert container["args"] == [
        "--default-provider=kubernetes",
        "--metrics-port=8080", "--max-concurrent-runs=50", f"--installation-id={OPERATOR_NS}/{SA_NAME}",
        "--sweep-interval=300", "--sweep-grace=600", f"--journal-key-secret={OPERATOR_NS}/{SA_NAME}-journal-key", "--log-format=text",
    ], ("every namespace; the local provider is off by default; kubernetes by default (off here: each Workflow naming "
        "no provider is refused saying so); the orphan sweep's label is unique per release")
    probe = container["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    env = {e["name"]: e for e in container["env"]}
    assert set(env) == {"POD_NAME", "POD_NAMESPACE", "DSB_K8S_DISABLED", "DSB_K8S_READY_TIMEOUT",
                        "DSB_K8S_UNSCHEDULABLE_GRACE"}, "no provider credentials unless an existing Secret is named"
    assert "only in watchNamespaces" in env["DSB_K8S_DISABLED"]["value"], "no Pods cluster-wide: the provider is off"
    # A read-only root filesystem: the writable places are emptyDirs.
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp", "/var/lib/durable-sandbox"}
    assert all("emptyDir" in v for v in pod["volumes"])

    role = one(docs, "ClusterRole")
    assert rules_by_resource(role) == EXPECTED_RULES, "no Secrets at all cluster-wide"
    [key_role] = by_kind(docs, "Role")
    assert key_role["metadata"]["namespace"] == OPERATOR_NS
    assert rules_by_resource(key_role) == {f"secrets[{SA_NAME}-journal-key]": {"get"}, "secrets": {"create"}}
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": OPERATOR_NS}]

    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]

    policy = one(docs, "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{OPERATOR_NS}:{SA_NAME}"'
    )


def test_namespaced_ha_metrics_values_narrow_rbac_to_roles(helm: Path, helm_home: Path) -> None:
    docs = render(helm, helm_home, "-f", str(VALUES / "namespaced.yaml"))
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding"), (
        "a namespaced install has nothing cluster-wide in RBAC"
    )
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(docs, "Role")}
    assert sorted(roles) == sorted([
        ("team-a", SA_NAME), ("team-b", SA_NAME), ("team-a", f"{SA_NAME}-secrets"), ("team-b", f"{SA_NAME}-secrets"),
        (OPERATOR_NS, f"{SA_NAME}-journal-key")])
    for ns in ("team-a", "team-b"):
        assert rules_by_resource(roles[ns, SA_NAME]) == {**EXPECTED_RULES, **SANDBOX_POD_RULES}
        assert rules_by_resource(roles[ns, f"{SA_NAME}-secrets"]) == {"secrets[sandbox-env]": {"get"}}
    bindings = by_kind(docs, "RoleBinding")
    assert sorted((b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bindings) == sorted(roles)
    assert all(b["roleRef"]["kind"] == "Role" for b in bindings)

    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "--namespace=team-a", "--namespace=team-b", "--allow-local-provider", "--default-provider=kubernetes",
        "--workflows=examples.flows",
        "--metrics-port=8080", "--max-concurrent-runs=20", "--installation-id=team-ab",
        "--sweep-interval=60", "--sweep-grace=900", f"--journal-key-secret={OPERATOR_NS}/{SA_NAME}-journal-key", "--log-format=text",
    ]
    [key] = [e for e in container["env"] if e["name"] == "E2B_API_KEY"]
    assert key["valueFrom"] == {"secretKeyRef": {"name": "e2b-credentials", "key": "E2B_API_KEY"}}
    env = {e["name"]: e for e in container["env"]}
    assert env["DSB_K8S_NAMESPACES"]["value"] == "team-a,team-b" and "DSB_K8S_DISABLED" not in env
    for var, optional in (("DSB_S3_BUCKET", False), ("DSB_S3_SECRET_ACCESS_KEY", False), ("DSB_S3_ENDPOINT", True)):
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "s3-snapshots" and ref["key"] == var and ref.get("optional", False) is optional
    assert json.loads(env["DSB_K8S_TEMPLATE"]["value"]) == {"image": "localhost/sandbox:test"}
    assert json.loads(env["DSB_K8S_POLICY"]["value"]) == {"runtimeClasses": ["gvisor"]}
    assert env["DSB_K8S_SNAPSHOT_LIMIT"]["value"] == "2Gi", "the snapshot archive's limit (issue 32, item 4)"
    # The policy the operator gets from these values still refuses a privileged template (and host namespaces).
    policy = TemplatePolicy.from_environ({"DSB_K8S_POLICY": env["DSB_K8S_POLICY"]["value"]})
    asking = PodTemplate.model_validate({"securityContext": {"privileged": True}, "hostPID": True})
    assert [p.split(":")[0] for p in asking.problems(policy)] == ["securityContext.privileged", "hostPID"]
    policies = by_kind(docs, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    for policy in policies:
        assert policy["spec"]["podSelector"] == {"matchLabels": {"durable-sandbox.dev/sandbox-pod": "true"}}
        assert policy["spec"]["ingress"] == [] and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        # DNS and public addresses (the defaults), then the values' own rule as written.
        assert len(policy["spec"]["egress"]) == 3
        assert policy["spec"]["egress"][2] == {"to": [{"ipBlock": {"cidr": "10.20.30.40/32"}}],
                                               "ports": [{"port": 3128, "protocol": "TCP"}]}
    assert env["DSB_K8S_EGRESS_POLICY"]["value"] == f"{SA_NAME}-sandboxes"

    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def operator_args(helm: Path, home: Path, *args: str) -> list[str]:
    [container] = one(render(helm, home, *args), "Deployment")["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["--set", "watchNamespaces={team-a}"], "kubernetes"),  # the kubernetes provider is on: it is the default
        (["--set", "watchNamespaces={team-a}", "--set", "allowLocalProvider=true",
          "--set", "providers.e2b.existingSecret=e2b"], "kubernetes"),
        # The kubernetes provider off: what else works here, else kubernetes (refused per Workflow, saying why).
        (["--set", "watchNamespaces={team-a}", "--set", "providers.kubernetes.enabled=false",
          "--set", "providers.e2b.existingSecret=e2b"], "e2b"),
        (["--set", "allowLocalProvider=true"], "local"),
        ([], "kubernetes"),
        # Named: passed as it is.
        (["--set", "watchNamespaces={team-a}", "--set", "defaultProvider=e2b"], "e2b"),
        (["--set", "allowLocalProvider=true", "--set", "defaultProvider=local"], "local"),
    ],
    ids=["kubernetes-on", "kubernetes-before-others", "e2b-when-kubernetes-off", "local-when-allowed", "none-works",
         "named-e2b", "named-local"],
)
def test_chart_passes_the_default_provider(helm: Path, helm_home: Path, values: list[str], expected: str) -> None:
    args = operator_args(helm, helm_home, *values)
    assert [a for a in args if a.startswith("--default-provider")] == [f"--default-provider={expected}"], args


@pytest.mark.parametrize(("values", "expected"), [([], "text"), (["--set", "logFormat=json"], "json")])
def test_chart_passes_the_log_format(helm: Path, helm_home: Path, values: list[str], expected: str) -> None:
    args = operator_args(helm, helm_home, *values)
    assert [a for a in args if a.startswith("--log-format")] == [f"--log-format={expected}"], args


def test_a_log_format_the_operator_has_not_fails_the_install(helm: Path, helm_home: Path) -> None:
    proc = run_helm(helm, helm_home, "template", RELEASE, str(CHART), "--kube-version", kube_version(),
                    "--set", "logFormat=yaml", check=False)
    assert proc.returncode != 0 and "logFormat" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "defaultProvider=kubernetes"], "defaultProvider is kubernetes, but the chart's kubernetes provider is off"),
        (["--set", "watchNamespaces={team-a}", "--set", "providers.kubernetes.enabled=false",
          "--set", "defaultProvider=kubernetes"], "set watchNamespaces (and providers.kubernetes.enabled: true)"),
        (["--set", "defaultProvider=local"], "defaultProvider is local, which the operator refuses unless allowLocalProvider"),
        (["--set", "defaultProvider=Not A Name"], "at '/defaultProvider'"),
    ],
    ids=["kubernetes-off", "kubernetes-disabled", "local-not-allowed", "not-a-name"],
)
def test_a_default_provider_that_cannot_work_fails_the_install(helm: Path, helm_home: Path, values: list[str],
                                                               message: str) -> None:
    proc = run_helm(helm, helm_home, "template", RELEASE, str(CHART), "--kube-version", kube_version(), *values,
                    check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_workflow_secrets_are_never_granted_cluster_wide(helm: Path, helm_home: Path) -> None:
    """Issue 20, item 7: a Secret read granted by a ClusterRole would hold in kube-system too. With every
    namespace watched, workflowSecrets needs the namespaces where Workflows may use them."""
    refused = run_helm(helm, helm_home, "template", RELEASE, str(CHART), "--kube-version", kube_version(),
                       "--set", "workflowSecrets={sandbox-env}", check=False)
    assert refused.returncode != 0 and "workflowSecrets needs the namespaces" in refused.stderr, refused.stderr

    docs = render(helm, helm_home, "--set", "workflowSecrets={sandbox-env}", "--set", "workflowSecretNamespaces={team-a}")
    assert rules_by_resource(one(docs, "ClusterRole")) == EXPECTED_RULES, "no Secret in the ClusterRole"
    secret_roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == f"{SA_NAME}-secrets"]
    assert [(r["metadata"]["namespace"], rules_by_resource(r)) for r in secret_roles] == [
        ("team-a", {"secrets[sandbox-env]": {"get"}})]


def test_worker_namespaces_get_the_worker_key_and_heartbeat_reads_only(helm: Path, helm_home: Path) -> None:
    """workerNamespaces: the operator writes the namespace's worker key and lists its workers' heartbeat Leases
    (WaitingForWorker; tests/e2e/test_chart_on_node.py runs a worker Deployment with these rights), nothing else."""
    docs = render(helm, helm_home, "--set", "workerNamespaces={team-a}")
    assert rules_by_resource(one(docs, "ClusterRole")) == EXPECTED_RULES
    [role] = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == f"{SA_NAME}-worker-key"]
    assert role["metadata"]["namespace"] == "team-a"
    assert rules_by_resource(role) == {"secrets[durable-sandbox-worker-key]": {"get", "update"}, "secrets": {"create"},
                                       "leases.coordination.k8s.io": {"list"}}


# The agent-sandbox provider's (providers.agentSandbox.enabled), in a watched namespace's Role only.
AGENT_SANDBOX_RULES = {
    "sandboxclaims.extensions.agents.x-k8s.io": {"get", "list", "create", "patch", "delete"},
    "sandboxes.agents.x-k8s.io": {"get"},
    "pods": {"get"},
    "pods/exec": {"get", "create"},
}


def test_agent_sandbox_rights_appear_only_when_enabled_and_only_in_watched_namespaces(helm: Path,
                                                                                     helm_home: Path) -> None:
    """Issue 37: providers.agentSandbox.enabled grants its claims, Sandboxes, Pods and exec in each watched
    namespace's Role and tells the operator so; off (the default), nothing of agent-sandbox's anywhere."""
    def granted(docs: list[dict[str, Any]]) -> list[str]:
        return sorted(key for role in [*by_kind(docs, "Role"), *by_kind(docs, "ClusterRole")]
                      for key in rules_by_resource(role) if "agents.x-k8s.io" in key)

    def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
        [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    for off in (render(helm, helm_home), render(helm, helm_home, "--set", "watchNamespaces={team-a}")):
        assert granted(off) == [] and not any(k.startswith("DSB_AGENT_SANDBOX") for k in env_of(off))

    docs = render(helm, helm_home, "--set", "watchNamespaces={team-a,team-b}", "--set",
                  "providers.kubernetes.enabled=false", "--set", "providers.agentSandbox.enabled=true",
                  "--set", "providers.agentSandbox.warmPool=python-pool", "--set",
                  "providers.agentSandbox.snapshotSizeLimit=256Mi")
    assert not by_kind(docs, "ClusterRole"), "watched namespaces: nothing cluster-wide"
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role") if r["metadata"]["name"] == SA_NAME}
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert rules_by_resource(role) == {**EXPECTED_RULES, **AGENT_SANDBOX_RULES}, (
            "only what the provider uses: no SandboxTemplates or SandboxWarmPools, no watch, no update, no Pod writes")
    env = env_of(docs)
    assert env["DSB_AGENT_SANDBOX_ENABLED"] == "true" and env["DSB_K8S_NAMESPACES"] == "team-a,team-b"
    assert env["DSB_AGENT_SANDBOX_WARM_POOL"] == "python-pool" and env["DSB_AGENT_SANDBOX_SNAPSHOT_LIMIT"] == "256Mi"
    assert env["DSB_AGENT_SANDBOX_WORKSPACE"] == "/workspace" and "DSB_K8S_DISABLED" in env

    both = render(helm, helm_home, "--set", "watchNamespaces={team-a}", "--set", "providers.agentSandbox.enabled=true")
    [role] = [r for r in by_kind(both, "Role") if r["metadata"]["name"] == SA_NAME]
    assert rules_by_resource(role) == {**EXPECTED_RULES, **SANDBOX_POD_RULES, **AGENT_SANDBOX_RULES,
                                       "pods": SANDBOX_POD_RULES["pods"]}, "the two providers' Pod rights merge"
    assert [e for e in env_of(both) if e == "DSB_K8S_NAMESPACES"] == ["DSB_K8S_NAMESPACES"]

    refused = run_helm(helm, helm_home, "template", RELEASE, str(CHART), "--kube-version", kube_version(),
                       "--set", "providers.agentSandbox.enabled=true", check=False)
    assert refused.returncode != 0 and "providers.agentSandbox.enabled needs watchNamespaces" in refused.stderr, (
        refused.stderr)


def test_postgres_journal_dsn_comes_from_a_secret_never_a_value(helm: Path, helm_home: Path) -> None:
    default = one(render(helm, helm_home), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "DSB_OPERATOR_JOURNAL" not in {e["name"] for e in default["env"]}, "the API-server journal by default"

    docs = render(helm, helm_home, "--set", "journal.postgres.secretName=journal-db", "--set", "journal.postgres.key=url")
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    [env] = [e for e in container["env"] if e["name"] == "DSB_OPERATOR_JOURNAL"]
    assert env == {"name": "DSB_OPERATOR_JOURNAL", "valueFrom": {"secretKeyRef": {"name": "journal-db", "key": "url"}}}
    assert not any("journal" in a and "postgres" in a for a in container["args"]), "never in the arguments"
    # The Secret is read by the kubelet: the operator gets no RBAC on it.
    assert not any("journal-db" in json.dumps(r) for r in [*by_kind(docs, "Role"), *by_kind(docs, "ClusterRole")])


def sandbox_policy(helm: Path, home: Path, *args: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The NetworkPolicy rendered for watched namespace team-a (None: none) and the operator container's env."""
    docs = render(helm, home, "--set", "watchNamespaces={team-a}", *args)
    policies = by_kind(docs, "NetworkPolicy")
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return (policies[0] if policies else None), {e["name"]: e.get("value") for e in container["env"]}


def test_sandbox_pods_get_an_egress_policy_by_default(helm: Path, helm_home: Path) -> None:
    """Issue 32 item 7: by default the sandbox Pods may reach DNS and public addresses, never the private ranges
    (Pods, Services, nodes, the API server on almost every cluster) or link-local (cloud metadata)."""
    policy, env = sandbox_policy(helm, helm_home)
    assert policy is not None and policy["metadata"]["name"] == f"{SA_NAME}-sandboxes"
    assert env["DSB_K8S_EGRESS_POLICY"] == f"{SA_NAME}-sandboxes", "the operator names the policy in its start log"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"durable-sandbox.dev/sandbox-pod": "true"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    dns, public = spec["egress"]
    assert dns == {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                   "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    v4, v6 = (peer["ipBlock"] for peer in public["to"])
    assert "ports" not in public, "public addresses on any port"
    assert v4["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                          "127.0.0.0/8", "169.254.0.0/16"} <= set(v4["except"])
    assert v6 == {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}
    # The operator makes no NetworkPolicy: it has no right on them (the chart renders the policy).
    docs = render(helm, helm_home, "--set", "watchNamespaces={team-a}")
    assert "networkpolicies" not in json.dumps([*by_kind(docs, "Role"), *by_kind(docs, "ClusterRole")])


@pytest.mark.parametrize(
    ("args", "egress"),
    [
        (["--set", "providers.kubernetes.networkPolicy.publicEgress=false",
          "--set", "providers.kubernetes.networkPolicy.dns=null"], []),
        (["--set", "providers.kubernetes.networkPolicy.publicEgress=false",
          "--set", "providers.kubernetes.networkPolicy.dns=null",
          "--set", "providers.kubernetes.networkPolicy.egress[0].ports[0].port=443"], [{"ports": [{"port": 443}]}]),
        (["--set", "providers.kubernetes.networkPolicy.dns=null",
          "--set", "providers.kubernetes.networkPolicy.deniedCIDRs={10.0.0.0/8}"],
         [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}},
                  {"ipBlock": {"cidr": "::/0", "except": []}}]}]),
    ],
    ids=["deny-all", "only-the-values-rule", "own-denied-ranges"],
)
def test_the_egress_policy_follows_the_values(helm: Path, helm_home: Path, args: list[str],
                                              egress: list[dict[str, Any]]) -> None:
    policy, _ = sandbox_policy(helm, helm_home, *args)
    assert policy is not None and policy["spec"]["egress"] == egress


def test_without_the_egress_policy_the_operator_is_told_none_limits_egress(helm: Path, helm_home: Path) -> None:
    policy, env = sandbox_policy(helm, helm_home, "--set", "providers.kubernetes.networkPolicy.enabled=false")
    assert policy is None and "DSB_K8S_EGRESS_POLICY" not in env, "the operator then warns at start"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("typo.yaml", "additional properties 'replicas' not allowed"),
        ("wrong-type.yaml", "at '/metrics/port': got string, want integer"),
        ("journal-dsn-in-values.yaml", "additional properties 'dsn' not allowed"),
    ],
)
def test_bad_values_are_refused_naming_the_key(helm: Path, helm_home: Path, values: str, message: str) -> None:
    proc = run_helm(
        helm, helm_home, "template", RELEASE, str(CHART), "--kube-version", kube_version(),
        "-f", str(VALUES / values), check=False,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------- installing


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with private_control_plane(tmp_path_factory.mktemp("chart-controlplane")) as cp:
        yield cp


def chart_objects(cp: ControlPlane) -> set[str]:
    """Everything labelled as this release's, cluster-wide and in every namespace."""
    kinds = (
        "deployments,services,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,"
        "poddisruptionbudgets,validatingadmissionpolicies,validatingadmissionpolicybindings,configmaps,secrets,"
        "networkpolicies"
    )
    items = cp.kubectl_json("get", kinds, "-A", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    return {f"{i['kind']}/{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items}


# ----------------------------------------------------------------------------------------------- the worker chart

WORKER_CHART = ROOT / "charts" / "durable-sandbox-worker"
WORKER_ARGS = ("--set", "queue=agents", "--set", "image.repository=registry.example/team-a/worker", "--set", "build=v2")


def render_worker(helm: Path, home: Path, *args: str) -> list[dict[str, Any]]:
    out = run_helm(helm, home, "template", "agents", str(WORKER_CHART), "-n", "team-a", "--kube-version",
                   kube_version(), *WORKER_ARGS, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_worker_chart_lints_and_renders_a_least_privilege_worker_of_one_build(helm: Path, helm_home: Path) -> None:
    from tests.e2e.worker_support import WORKER_RULES

    proc = run_helm(helm, helm_home, "lint", "--strict", str(WORKER_CHART), *WORKER_ARGS)
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    docs = render_worker(helm, helm_home)
    assert sorted(d["kind"] for d in docs) == ["Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service",
                                               "ServiceAccount"], "no ClusterRole: nothing outside its namespace"
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    role = one(docs, "Role")
    assert rules_by_resource(role) == rules_by_resource({"rules": WORKER_RULES}), "the worker Role of docs/kubernetes.md"
    binding = one(docs, "RoleBinding")
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "team-a"}]

    deploy = one(docs, "Deployment")
    assert deploy["metadata"]["name"] == "agents-durable-sandbox-worker-v2" and deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa and pod["terminationGracePeriodSeconds"] > 20  # the worker's hand-over grace
    [container] = pod["containers"]
    assert container["image"] == "registry.example/team-a/worker:v2"
    assert container["command"] == ["dsb"] and container["args"] == [
        "worker", "--kube", "--queue=agents", "--build-id=v2", "--concurrency=4", "--poll-interval=1",
        "--metrics-port=8080", "--metrics-host=0.0.0.0"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp", "/var/lib/durable-sandbox"}
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"

    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    assert deploy["spec"]["template"]["metadata"]["labels"]["durable-sandbox.dev/worker-build"] == "v2"


def test_the_worker_chart_keeps_older_builds_running_beside_the_new_one(helm: Path, helm_home: Path) -> None:
    docs = render_worker(helm, helm_home, "--set", "keepBuilds[0].build=v1", "--set", "keepBuilds[1].build=v0",
                         "--set", "keepBuilds[1].tag=2026-11-30", "--set", "keepBuilds[1].replicas=0")
    deploys = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert sorted(deploys) == ["agents-durable-sandbox-worker-v0", "agents-durable-sandbox-worker-v1",
                               "agents-durable-sandbox-worker-v2"]
    v1 = deploys["agents-durable-sandbox-worker-v1"]
    assert v1["spec"]["replicas"] == 1 and "--build-id=v1" in v1["spec"]["template"]["spec"]["containers"][0]["args"]
    v0 = deploys["agents-durable-sandbox-worker-v0"]
    assert v0["spec"]["replicas"] == 0
    assert v0["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/team-a/worker:2026-11-30"
    selectors = [d["spec"]["selector"]["matchLabels"] for d in deploys.values()]
    assert len({json.dumps(s, sort_keys=True) for s in selectors}) == 3, "no build's Deployment selects another's Pods"
    assert sorted(p["metadata"]["name"] for p in by_kind(docs, "PodDisruptionBudget")) == [
        "agents-durable-sandbox-worker-v1", "agents-durable-sandbox-worker-v2"]  # none for a build scaled to 0
    assert len(by_kind(docs, "Role")) == 1


def test_the_worker_chart_serves_metrics_on_its_port_as_the_operator_s_chart_does(helm: Path, helm_home: Path) -> None:
    docs = render_worker(helm, helm_home, "--set", "metrics.port=9464", "--set", "metrics.serviceMonitor.enabled=true",
                         "--set", "metrics.serviceMonitor.labels.release=prom", "--set", "keepBuilds[0].build=v1")
    for deploy in by_kind(docs, "Deployment"):
        [container] = deploy["spec"]["template"]["spec"]["containers"]
        assert "--metrics-port=9464" in container["args"] and "--metrics-host=0.0.0.0" in container["args"]
        assert container["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "durable-sandbox-worker",
                                           "app.kubernetes.io/instance": "agents"}, "every build's workers"
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics" and monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    quiet = render_worker(helm, helm_home, "--set", "metrics.service.enabled=false")
    assert not by_kind(quiet, "Service") and not by_kind(quiet, "ServiceMonitor")
    proc = run_helm(helm, helm_home, "template", "agents", str(WORKER_CHART), "-n", "team-a", "--kube-version",
                    kube_version(), *WORKER_ARGS, "--set", "metrics.service.enabled=false",
                    "--set", "metrics.serviceMonitor.enabled=true", check=False)
    assert proc.returncode != 0 and "metrics.serviceMonitor.enabled needs metrics.service.enabled" in proc.stderr


def test_the_worker_chart_grants_sandbox_pods_only_when_asked(helm: Path, helm_home: Path) -> None:
    rules = rules_by_resource(one(render_worker(helm, helm_home, "--set", "rbac.sandboxPods=true"), "Role"))
    assert {k: v for k, v in rules.items() if k in SANDBOX_POD_RULES} == SANDBOX_POD_RULES
    assert "pods" not in rules_by_resource(one(render_worker(helm, helm_home), "Role"))


def test_the_worker_chart_mounts_extra_volumes_beside_its_own(helm: Path, helm_home: Path) -> None:
    pod = one(render_worker(helm, helm_home, "--set", "extraVolumes[0].name=ca",
                            "--set", "extraVolumes[0].configMap.name=team-ca", "--set", "extraVolumeMounts[0].name=ca",
                            "--set", "extraVolumeMounts[0].mountPath=/etc/team-ca"), "Deployment")["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}, {"name": "state", "emptyDir": {}},
                              {"name": "ca", "configMap": {"name": "team-ca"}}]
    [container] = pod["containers"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp", "/var/lib/durable-sandbox", "/etc/team-ca"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "queue="], "queue"),
    (["--set", "build=has space"], "build"),
    (["--set", "queue=Agents_1"], "queue"),
    (["--set", "keepBuilds[0].build=v2"], "keepBuilds names build v2"),
    (["--set", "metrics.port=0"], "metrics"),
    (["--set", "extraVolumeMounts[0].name=ca"], "extraVolumeMounts"),
])
def test_the_worker_chart_refuses_bad_values_naming_them(helm: Path, helm_home: Path, args: list[str],
                                                         message: str) -> None:
    proc = run_helm(helm, helm_home, "template", "agents", str(WORKER_CHART), "-n", "team-a", "--kube-version",
                    kube_version(), *WORKER_ARGS, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr



def test_install_upgrade_uninstall(cluster: ControlPlane, helm: Path, helm_home: Path) -> None:
    kc = cluster.kubeconfig
    assert not cluster.kubectl("get", "crd", "-o", "name").stdout.strip(), "a fresh cluster has no CRDs"
    cluster.kubectl("create", "namespace", "team-a")
    cluster.kubectl("create", "namespace", "team-b")

    proc = run_helm(
        helm, helm_home, "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
        "-f", str(VALUES / "namespaced.yaml"), "--set", "metrics.serviceMonitor.enabled=false", kubeconfig=kc,
    )
    assert "kubectl -n durable-sandbox-system rollout status deployment/dsb-durable-sandbox" in proc.stdout, (
        "NOTES.txt tells the user what to do next"
    )
    assert 'names no provider gets "kubernetes"' in proc.stdout and "examples/default-provider-workflow.yaml" in proc.stdout
    assert f"limited by NetworkPolicy {SA_NAME}-sandboxes" in proc.stdout and "enforced\nonly if" in proc.stdout, (
        "NOTES.txt says the sandbox egress policy needs an enforcer")
    crds = set(cluster.kubectl("get", "crd", "-o", "name").stdout.split())
    assert crds == {
        "customresourcedefinition.apiextensions.k8s.io/workflows.durable-sandbox.dev",
        "customresourcedefinition.apiextensions.k8s.io/sandboxes.durable-sandbox.dev",
        "customresourcedefinition.apiextensions.k8s.io/journals.durable-sandbox.dev",
        "customresourcedefinition.apiextensions.k8s.io/sandboxpools.durable-sandbox.dev",
        "customresourcedefinition.apiextensions.k8s.io/workflowschedules.durable-sandbox.dev",
    }
    installed = chart_objects(cluster)
    assert installed == {
        f"ServiceAccount/{OPERATOR_NS}/{SA_NAME}",
        f"Deployment/{OPERATOR_NS}/{SA_NAME}",
        f"Service/{OPERATOR_NS}/{SA_NAME}-metrics",
        f"PodDisruptionBudget/{OPERATOR_NS}/{SA_NAME}",
        f"Role/team-a/{SA_NAME}", f"RoleBinding/team-a/{SA_NAME}",
        f"Role/team-b/{SA_NAME}", f"RoleBinding/team-b/{SA_NAME}",
        f"NetworkPolicy/team-a/{SA_NAME}-sandboxes", f"NetworkPolicy/team-b/{SA_NAME}-sandboxes",
        f"Role/team-a/{SA_NAME}-secrets", f"RoleBinding/team-a/{SA_NAME}-secrets",
        f"Role/team-b/{SA_NAME}-secrets", f"RoleBinding/team-b/{SA_NAME}-secrets",
        f"Role/{OPERATOR_NS}/{SA_NAME}-journal-key", f"RoleBinding/{OPERATOR_NS}/{SA_NAME}-journal-key",
        f"ValidatingAdmissionPolicy//{SA_NAME}-no-spec-writes",
        f"ValidatingAdmissionPolicyBinding//{SA_NAME}-no-spec-writes",
    }
    deploy = cluster.kubectl_json("get", "deployment", SA_NAME, "-n", OPERATOR_NS)
    assert deploy["spec"]["replicas"] == 2

    # A typo is refused by the schema, for a new release and for an upgrade, and nothing of it is made.
    # (Helm installs crds/ before it renders templates, so that part of a first install is not undone.)
    for verb, release in (("install", "typo"), ("upgrade", RELEASE)):
        bad = run_helm(helm, helm_home, verb, release, str(CHART), "-n", OPERATOR_NS, "-f", str(VALUES / "typo.yaml"),
                       kubeconfig=kc, check=False)
        assert bad.returncode != 0 and "additional properties 'replicas' not allowed" in bad.stderr, bad.stderr
    releases = json.loads(run_helm(helm, helm_home, "list", "-A", "-o", "json", kubeconfig=kc).stdout)
    assert [(r["name"], r["revision"]) for r in releases] == [(RELEASE, "1")]
    assert chart_objects(cluster) == installed

    # Upgrade: one replica (the PodDisruptionBudget goes) and cluster-wide (Roles become a ClusterRole).
    run_helm(
        helm, helm_home, "upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--set", "replicaCount=1",
        kubeconfig=kc,
    )
    deploy = cluster.kubectl_json("get", "deployment", SA_NAME, "-n", OPERATOR_NS)
    assert deploy["spec"]["replicas"] == 1
    assert not [a for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"] if "--namespace" in a]
    upgraded = chart_objects(cluster)
    assert f"PodDisruptionBudget/{OPERATOR_NS}/{SA_NAME}" not in upgraded
    assert f"ClusterRole//{SA_NAME}" in upgraded and f"Role/team-a/{SA_NAME}" not in upgraded
    history = json.loads(run_helm(helm, helm_home, "history", RELEASE, "-n", OPERATOR_NS, "-o", "json",
                                  kubeconfig=kc).stdout)
    assert [h["revision"] for h in history] == [1, 2]

    # A Workflow made while installed survives uninstall with its CRD.
    cluster.kubectl("apply", "-n", "team-a", "-f", str(ROOT / "examples" / "hello-workflow.yaml"))
    run_helm(helm, helm_home, "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout", "60s", kubeconfig=kc)
    assert chart_objects(cluster) == set(), "uninstall removes everything the chart made..."
    assert set(cluster.kubectl("get", "crd", "-o", "name").stdout.split()) == crds, "...except the CRDs"
    cluster.kubectl("get", "workflow", "hello", "-n", "team-a")


SA_USER = f"system:serviceaccount:{OPERATOR_NS}:{SA_NAME}"


def can_i(cp: ControlPlane, *args: str) -> bool:
    proc = cp.kubectl("auth", "can-i", *args, f"--as={SA_USER}", check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode == 0


def as_operator(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl(*args, as_user=SA_USER, check=False)


@pytest.fixture
def namespaced_install(cluster: ControlPlane, helm: Path, helm_home: Path) -> Iterator[None]:
    for ns in ("team-a", "team-b", "team-c"):
        if cluster.kubectl("get", "namespace", ns, check=False).returncode != 0:
            cluster.kubectl("create", "namespace", ns)
    run_helm(
        helm, helm_home, "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
        "-f", str(VALUES / "namespaced.yaml"), "--set", "metrics.serviceMonitor.enabled=false",
        kubeconfig=cluster.kubeconfig,
    )
    try:
        yield
    finally:
        run_helm(helm, helm_home, "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", kubeconfig=cluster.kubeconfig)


def test_rbac_is_least_privilege(cluster: ControlPlane, namespaced_install: None) -> None:
    for ns in ("team-a", "team-c"):
        cluster.kubectl("create", "secret", "generic", "sandbox-env", "-n", ns, "--from-literal=TOKEN=t")
        cluster.kubectl("create", "secret", "generic", "other", "-n", ns, "--from-literal=TOKEN=t")
        cluster.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "hello-workflow.yaml"))

    allowed = [
        ("list", "workflows.durable-sandbox.dev", "-n", "team-a"),
        ("watch", "sandboxes.durable-sandbox.dev", "-n", "team-b"),
        ("patch", "workflows.durable-sandbox.dev", "-n", "team-a"),
        ("delete", "workflows.durable-sandbox.dev", "-n", "team-a"),
        ("patch", "workflows.durable-sandbox.dev", "--subresource=status", "-n", "team-a"),
        ("update", "workflows.durable-sandbox.dev", "--subresource=finalizers", "-n", "team-a"),
        ("create", "workflows.durable-sandbox.dev", "-n", "team-a"),  # a WorkflowSchedule's ticks, child workflows
        ("patch", "workflowschedules.durable-sandbox.dev", "--subresource=status", "-n", "team-a"),
        ("create", "journals.durable-sandbox.dev", "-n", "team-a"),
        ("update", "journals.durable-sandbox.dev", "-n", "team-b"),
        ("create", "events", "-n", "team-a"),
        ("get", "secrets/sandbox-env", "-n", "team-a"),
        # The kubernetes provider, in the watched namespaces only: sandbox Pods, exec, their env Secrets.
        ("create", "pods", "-n", "team-a"),
        ("list", "pods", "-n", "team-b"),
        ("patch", "pods", "-n", "team-a"),
        ("delete", "pods", "-n", "team-b"),
        ("create", "pods", "--subresource=exec", "-n", "team-a"),
        ("get", "pods", "--subresource=exec", "-n", "team-b"),
        ("get", "pods", "--subresource=log", "-n", "team-b"),
        ("create", "secrets", "-n", "team-a"),
        ("get", "podtemplates", "-n", "team-a"),
    ]
    denied = [
        ("get", "secrets/other", "-n", "team-a"),
        ("list", "secrets", "-n", "team-a"),
        ("get", "secrets/sandbox-env", "-n", "team-c"),
        ("list", "pods", "-n", "team-c"),
        ("create", "pods", "-n", "team-c"),
        ("list", "pods", "--all-namespaces"),
        ("create", "pods", "--subresource=exec", "-n", "team-c"),
        ("create", "pods", "--subresource=exec", "-n", OPERATOR_NS),
        ("update", "pods", "-n", "team-a"),
        ("create", "pods", "--subresource=attach", "-n", "team-a"),
        ("create", "pods", "--subresource=portforward", "-n", "team-a"),
        ("create", "pods", "--subresource=ephemeralcontainers", "-n", "team-a"),
        ("watch", "secrets", "-n", "team-a"),
        ("create", "secrets", "-n", "team-c"),
        ("list", "podtemplates", "-n", "team-a"),
        ("list", "workflows.durable-sandbox.dev", "-n", "team-c"),
        ("list", "workflows.durable-sandbox.dev", "--all-namespaces"),
        ("update", "workflows.durable-sandbox.dev", "-n", "team-a"),
        ("create", "journals.durable-sandbox.dev", "-n", "team-c"),
        ("create", "configmaps", "-n", "team-a"),
        ("update", "leases.coordination.k8s.io", "-n", "team-a"),
        ("update", "leases.coordination.k8s.io", "-n", "kube-system"),
        ("delete", "leases.coordination.k8s.io", "-n", "kube-node-lease"),
        ("patch", "configmaps", "-n", "kube-system"),
        ("get", "secrets/sandbox-env", "-n", "kube-system"),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "deployments.apps", "-n", "team-a"),
        ("create", "rolebindings.rbac.authorization.k8s.io", "-n", "team-a"),
        # The agent-sandbox provider is off in these values: none of its rights (issue 37).
        ("create", "sandboxclaims.extensions.agents.x-k8s.io", "-n", "team-a"),
        ("get", "sandboxes.agents.x-k8s.io", "-n", "team-a"),
        ("*", "*"),
    ]
    assert [a for a in allowed if not can_i(cluster, *a)] == []
    assert [d for d in denied if can_i(cluster, *d)] == []

    # Real requests, as the ServiceAccount: the API server refuses them.
    for args, what in [
        (("get", "secret", "other", "-n", "team-a"), 'secrets "other" is forbidden'),
        (("get", "secret", "sandbox-env", "-n", "team-c"), 'secrets "sandbox-env" is forbidden'),
        (("get", "secrets", "-n", "team-a"), "cannot list resource \"secrets\""),
        (("get", "pods", "-n", "team-c"), "cannot list resource \"pods\""),
        (("get", "pods", "-A"), "cannot list resource \"pods\""),
        (("get", "workflows", "-n", "team-c"), "cannot list resource \"workflows\""),
        (("create", "configmap", "sneaky", "-n", "team-a"), "cannot create resource \"configmaps\""),
    ]:
        proc = as_operator(cluster, *args)
        assert proc.returncode != 0 and what in proc.stderr, (args, proc.stderr)
    # ...and allow what the operator needs.
    secret = as_operator(cluster, "get", "secret", "sandbox-env", "-n", "team-a", "-o", "jsonpath={.metadata.name}")
    assert secret.returncode == 0 and secret.stdout == "sandbox-env", secret.stderr

    # Spec (and labels, annotations) are off limits even though RBAC must allow patch (for the finalizer):
    # the chart's ValidatingAdmissionPolicy refuses them. Policies take effect asynchronously: wait with
    # server-side dry runs (admission runs, nothing is stored), then show a real request refused.
    spec_patch = ("patch", "workflow", "hello", "-n", "team-a", "--type=merge", "-p",
                  '{"spec":{"snapshotEveryNCalls":5}}')
    cluster.wait_until(
        lambda: "does not write spec" in as_operator(cluster, *spec_patch, "--dry-run=server").stderr,
        60, "the ValidatingAdmissionPolicy to refuse the operator's spec writes",
    )
    refused = as_operator(cluster, *spec_patch)
    assert refused.returncode != 0
    assert "the durable-sandbox operator does not write spec" in refused.stderr, refused.stderr
    labels = as_operator(cluster, "label", "workflow", "hello", "-n", "team-a", "owner=operator")
    assert labels.returncode != 0 and "does not write labels or annotations" in labels.stderr, labels.stderr
    after = cluster.kubectl_json("get", "workflow", "hello", "-n", "team-a")
    assert after["spec"]["snapshotEveryNCalls"] == 2 and "owner" not in after["metadata"].get("labels", {})

    # What the operator does write goes through: its finalizer, and status through the subresource.
    finalizer = as_operator(cluster, "patch", "workflow", "hello", "-n", "team-a", "--type=merge", "-p",
                            '{"metadata":{"finalizers":["durable-sandbox.dev/cleanup"]}}')
    assert finalizer.returncode == 0, finalizer.stderr
    status = as_operator(cluster, "patch", "workflow", "hello", "-n", "team-a", "--subresource=status",
                         "--type=merge", "-p", '{"status":{"phase":"Running"}}')
    assert status.returncode == 0, status.stderr
    removed = as_operator(cluster, "patch", "workflow", "hello", "-n", "team-a", "--type=json", "-p",
                          '[{"op":"remove","path":"/metadata/finalizers"}]')
    assert removed.returncode == 0, removed.stderr
    # Users (here the admin) still edit spec freely: the policy matches the operator's ServiceAccount only.
    cluster.kubectl("patch", "workflow", "hello", "-n", "team-a", "--type=merge", "-p", '{"spec":{"suspend":true}}')


def test_the_session_api_values_render_its_port_service_tls_and_rbac(helm: Path, helm_home: Path) -> None:
    """sessionApi.enabled (docs/agents.md): the operator serves the call API on its port, over TLS from the named
    Secret; a Service; the callers' ClusterRole (create sandboxes/calls, nothing else); and the operator's own
    right to ask TokenReview and SubjectAccessReview, nothing more."""
    docs = render(helm, helm_home, "--set", "sessionApi.enabled=true", "--set", "sessionApi.tls.existingSecret=dsb-tls",
                  "--set", "watchNamespaces={team-a}")
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"--session-port=8443", "--session-max-concurrent-calls=4", "--session-max-request-bytes=1048576",
            "--session-max-calls-per-second=20", "--session-hold-seconds=5",
            "--session-tls-cert=/etc/durable-sandbox/session-tls/tls.crt",
            "--session-tls-key=/etc/durable-sandbox/session-tls/tls.key"} <= set(container["args"])
    assert {"name": "sessions", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "session-tls", "secret": {"secretName": "dsb-tls"}} in volumes
    sessions = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == f"{SA_NAME}-sessions"]
    assert [p["targetPort"] for p in sessions[0]["spec"]["ports"]] == ["sessions"]
    roles = {r["metadata"]["name"]: rules_by_resource(r) for r in by_kind(docs, "ClusterRole")}
    assert roles == {"durable-sandbox-sandbox-caller": {"sandboxes/calls.durable-sandbox.dev": {"create"}},
                     "durable-sandbox-sandbox-owner": {"sandboxes/calls.durable-sandbox.dev": {"create"},
                                                       "sandboxes.durable-sandbox.dev": {"get", "create", "patch",
                                                                                          "delete", "update"}},
                     f"{SA_NAME}-session-auth": {"tokenreviews.authentication.k8s.io": {"create"},
                                                 "subjectaccessreviews.authorization.k8s.io": {"create"}}}
    [binding] = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == f"{SA_NAME}-session-auth"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": OPERATOR_NS}]


def test_the_tracing_values_set_opentelemetrys_variables_and_are_off_by_default(helm: Path, helm_home: Path) -> None:
    """tracing.* (docs/operations.md, "Traces"): off without an endpoint (no OTEL_* at all); with one, the SDK's own
    variables; the trace UI's address for the web view's links."""
    def env_of(*args: str) -> dict[str, str]:
        [container] = one(render(helm, helm_home, *args), "Deployment")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert not [k for k in env_of() if k.startswith("OTEL_") or k == "DURABLE_SANDBOX_TRACE_UI"]
    env = env_of("--set", "tracing.endpoint=http://collector.obs:4318", "--set", "tracing.samplerArg=0.25",
                 "--set", "tracing.uiUrl=https://jaeger.example/trace/{trace_id}")
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.obs:4318"
    assert env["OTEL_SERVICE_NAME"] == "durable-sandbox-operator"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert env["DURABLE_SANDBOX_TRACE_UI"] == "https://jaeger.example/trace/{trace_id}"
    refused = run_helm(helm, helm_home, "template", RELEASE, str(CHART), "--kube-version", kube_version(),
                       "--set", "tracing.sampler=sometimes", check=False)
    assert refused.returncode != 0 and "sampler" in refused.stderr, refused.stderr

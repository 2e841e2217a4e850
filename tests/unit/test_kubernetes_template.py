"""The kubernetes provider's Pod template: its sources, the Pod it makes, and what the policy refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable_sandbox.providers.contract import ConfigurationError, ProvisionError
from durable_sandbox.providers.kubernetes_template import (
    DEFAULT_IMAGE,
    WORKSPACE,
    PodTemplate,
    TemplatePolicy,
    pod_template_reference,
)


def pod(template: PodTemplate, env_secret: str | None = None) -> dict[str, Any]:
    return template.pod(name="dsb-x", namespace="ns", labels={"durable-sandbox.dev/owner-key": "k"},
                        annotations={"durable-sandbox.dev/lease": "1"}, env_secret=env_secret)


def test_the_default_pod_is_restricted_tokenless_and_never_restarted() -> None:
    manifest = pod(PodTemplate())
    spec = manifest["spec"]
    (container,) = spec["containers"]
    assert container["image"] == DEFAULT_IMAGE and container["workingDir"] == WORKSPACE
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["hostNetwork"] is spec["hostPID"] is spec["hostIPC"] is False
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "workspace", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]
    assert {"name": "workspace", "mountPath": WORKSPACE} in container["volumeMounts"]
    assert "envFrom" not in container and "serviceAccountName" not in spec
    assert {(t["key"], t["tolerationSeconds"]) for t in spec["tolerations"]} == {
        ("node.kubernetes.io/not-ready", 30), ("node.kubernetes.io/unreachable", 30)}, "a lost node: evicted in 30 s"
    assert manifest["metadata"]["labels"] == {"durable-sandbox.dev/owner-key": "k"}
    assert PodTemplate().problems(TemplatePolicy()) == []


def test_env_comes_from_a_secret_never_the_pod_spec() -> None:
    container = pod(PodTemplate(), env_secret="dsb-x-env")["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "dsb-x-env"}}]
    assert container["env"] == [{"name": "HOME", "value": WORKSPACE}]


def test_a_templates_security_context_is_laid_over_the_restricted_default() -> None:
    template = PodTemplate.model_validate({"securityContext": {"runAsUser": 2000, "capabilities": {"add": ["NET_RAW"]}}})
    sc = template.security_context
    assert sc["runAsUser"] == 2000 and sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}


@pytest.mark.parametrize(("fields", "field", "allow"), [
    ({"securityContext": {"privileged": True}}, "securityContext.privileged", {"privileged": True}),
    ({"securityContext": {"allowPrivilegeEscalation": True}}, "securityContext.allowPrivilegeEscalation",
     {"privileged": True}),
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "securityContext.seccompProfile",
     {"privileged": True}),
    ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "securityContext.capabilities.add",
     {"capabilities": ["SYS_ADMIN"]}),
    ({"hostNetwork": True}, "hostNetwork", {"hostNamespaces": True}),
    ({"hostPID": True}, "hostPID", {"hostNamespaces": True}),
    ({"hostIPC": True}, "hostIPC", {"hostNamespaces": True}),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "volumes[root].hostPath", {"hostPath": True}),
    ({"serviceAccountName": "deployer"}, "serviceAccountName", {"serviceAccounts": ["deployer"]}),
    ({"runtimeClassName": "runc"}, "runtimeClassName", {"runtimeClasses": ["runc"]}),
    # Issue 32, item 5: an allow-list, not a deny-list. Each of these became a sandbox Pod before.
    ({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]},
     "volumes[t].projected.sources[0].serviceAccountToken", {"volumeTypes": ["serviceAccountToken"]}),
    ({"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}, "volumes[s].secret", {"volumeTypes": ["secret"]}),
    ({"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "db"}}]}}]},
     "volumes[p].projected.sources[0].secret", {"volumeTypes": ["secret"]}),
    ({"volumes": [{"name": "n", "nfs": {"server": "x", "path": "/"}}]}, "volumes[n].nfs", {"volumeTypes": ["nfs"]}),
    ({"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}, "volumes[c].csi",
     {"volumeTypes": ["csi"]}),
    ({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}, "securityContext.appArmorProfile",
     {"privileged": True}),
    ({"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}}, "podSecurityContext.appArmorProfile",
     {"privileged": True}),
    ({"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}, "podSecurityContext.seccompProfile",
     {"privileged": True}),
    ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "securityContext.seLinuxOptions.type",
     {"seLinuxTypes": ["spc_t"]}),
    ({"podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "podSecurityContext.seLinuxOptions.type",
     {"seLinuxTypes": ["spc_t"]}),
    ({"securityContext": {"seLinuxOptions": {"user": "system_u"}}}, "securityContext.seLinuxOptions.user",
     {"privileged": True}),
    ({"securityContext": {"runAsUser": 0, "runAsNonRoot": True}}, "securityContext.runAsUser", {"runAsRoot": True}),
    ({"securityContext": {"runAsGroup": 0}}, "securityContext.runAsGroup", {"runAsRoot": True}),
    ({"securityContext": {"runAsNonRoot": False}}, "securityContext.runAsNonRoot", {"runAsRoot": True}),
    ({"podSecurityContext": {"runAsUser": 0}}, "podSecurityContext.runAsUser", {"runAsRoot": True}),
    ({"securityContext": {"capabilities": {"drop": []}}}, "securityContext.capabilities.drop", {"privileged": True}),
    ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, "securityContext.windowsOptions", None),
    ({"podSecurityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}},
     "podSecurityContext.sysctls", {"privileged": True}),
    ({"volumeMounts": [{"name": "x", "mountPath": "/x", "mountPropagation": "Bidirectional"}],
      "volumes": [{"name": "x", "emptyDir": {}}]}, "volumeMounts[x].mountPropagation", {"privileged": True}),
    ({"annotations": {"container.apparmor.security.beta.kubernetes.io/sandbox": "unconfined"}},
     "annotations.container.apparmor.security.beta.kubernetes.io/sandbox", {"privileged": True}),
    ({"serviceAccountName": "default"}, "serviceAccountName", {"serviceAccounts": ["default"]}),
])
def test_what_the_policy_refuses_unless_the_operator_allows_it(fields: dict[str, Any], field: str,
                                                               allow: dict[str, Any] | None) -> None:
    template = PodTemplate.model_validate(fields)
    refusing = TemplatePolicy.model_validate({"runtimeClasses": ["gvisor"]} if "runtimeClassName" in fields else {})
    problems = template.problems(refusing)
    assert len(problems) == 1 and problems[0].startswith(field + ":"), problems
    with pytest.raises(ProvisionError) as excinfo:
        template.check(refusing, source="spec.sandbox.template")
    assert excinfo.value.retryable is False
    assert field in str(excinfo.value) and "providers.kubernetes.allow" in str(excinfo.value)
    if allow is None:  # nothing allows it
        assert len(template.problems(TemplatePolicy.model_validate({"privileged": True, "runAsRoot": True}))) == 1
    else:
        assert "(allow: " + next(iter(allow)) in problems[0], "each refusal says which setting allows it"
        assert template.problems(TemplatePolicy.model_validate(allow)) == []


def test_what_the_allow_list_takes_without_any_configuration() -> None:
    template = PodTemplate.model_validate({
        "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "c"}},
                    {"name": "info", "downwardAPI": {"items": [{"path": "labels",
                                                                "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                    {"name": "both", "projected": {"sources": [{"configMap": {"name": "c"}}, {"downwardAPI": {}}]}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch", "mountPropagation": "None"}],
        "securityContext": {"runAsUser": 2000, "readOnlyRootFilesystem": True, "seLinuxOptions": {"level": "s0:c1"},
                            "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
                            "appArmorProfile": {"type": "RuntimeDefault"}},
        "podSecurityContext": {"fsGroup": 2000, "supplementalGroups": [3000]},
        "annotations": {"container.apparmor.security.beta.kubernetes.io/sandbox": "runtime/default"},
    })
    assert template.problems(TemplatePolicy()) == []


@pytest.mark.parametrize(("spec", "field"), [
    ({"serviceAccountName": "deployer", "serviceAccount": "deployer"}, "spec.serviceAccountName"),
    ({"serviceAccountName": "default", "serviceAccount": "default"}, "spec.serviceAccountName"),
    ({"automountServiceAccountToken": True}, "spec.automountServiceAccountToken"),
])
def test_a_pod_template_object_never_chooses_a_service_account_or_a_token(spec: dict[str, Any], field: str) -> None:
    body = {"template": {"spec": {**spec, "containers": [{"name": "c", "image": "busybox"}]}}}
    everything = TemplatePolicy.model_validate({"serviceAccounts": ["deployer", "default"], "privileged": True})
    with pytest.raises(ProvisionError) as refused:
        PodTemplate().from_pod_template("who", body).check(everything, source="PodTemplate who")
    assert refused.value.retryable is False
    assert f"PodTemplate who: {field}" in str(refused.value) and "remove them" in str(refused.value)
    told_false = {"template": {"spec": {"automountServiceAccountToken": False, "containers": [{"image": "busybox"}]}}}
    assert PodTemplate().from_pod_template("who", told_false).problems(TemplatePolicy()) == []


def test_the_workspace_and_the_operators_labels_cannot_be_taken_over() -> None:
    template = PodTemplate.model_validate({
        "volumes": [{"name": "workspace", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/workspace/"}],
        "labels": {"durable-sandbox.dev/owner-key": "forged"}, "command": [],
    })
    problems = "\n".join(template.problems(TemplatePolicy()))
    for field in ("volumes[workspace]", "volumeMounts", "labels.durable-sandbox.dev/owner-key", "command"):
        assert field in problems


def test_a_pod_template_object_is_overlaid_and_unknown_fields_are_refused_by_name() -> None:
    body = {"template": {"metadata": {"labels": {"team": "a"}}, "spec": {
        "runtimeClassName": "gvisor", "nodeSelector": {"pool": "sandboxes"},
        "tolerations": [{"key": "sandbox", "operator": "Exists"}],
        "containers": [{"name": "main", "image": "python:3.12", "resources": {"limits": {"memory": "1Gi"}}}],
    }}}
    template = PodTemplate().from_pod_template("python", body)
    assert template.image == "python:3.12" and template.runtime_class_name == "gvisor"
    assert template.labels == {"team": "a"} and template.resources == {"limits": {"memory": "1Gi"}}
    assert template.security_context["runAsNonRoot"] is True
    body["template"]["spec"]["initContainers"] = [{"name": "i", "image": "x"}]
    body["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    with pytest.raises(ProvisionError, match=r"PodTemplate python: .*containers\[0\]\.ports, spec\.initContainers"):
        PodTemplate().from_pod_template("python", body)
    with pytest.raises(ProvisionError, match="exactly one container"):
        PodTemplate().from_pod_template("two", {"template": {"spec": {"containers": [{}, {}]}}})


def test_template_strings_and_the_operators_configuration() -> None:
    assert pod_template_reference("podtemplate/python") == "python"
    assert pod_template_reference("python:3.12") is None and pod_template_reference(None) is None
    with pytest.raises(ProvisionError):
        pod_template_reference("podtemplate/Not_A_Name")
    assert PodTemplate().with_image("python:3.12").image == "python:3.12"
    with pytest.raises(ProvisionError):
        PodTemplate().with_image("two words")
    configured = PodTemplate.from_environ({"DSB_K8S_TEMPLATE": json.dumps({"image": "img:1", "runtimeClassName": "gvisor"})})
    assert configured.image == "img:1" and configured.runtime_class_name == "gvisor"
    with pytest.raises(ConfigurationError, match="DSB_K8S_TEMPLATE"):
        PodTemplate.from_environ({"DSB_K8S_TEMPLATE": json.dumps({"imag": "typo"})})
    assert TemplatePolicy.from_environ({"DSB_K8S_POLICY": json.dumps({"privileged": True})}).privileged
    with pytest.raises(ConfigurationError, match="DSB_K8S_POLICY"):
        TemplatePolicy.from_environ({"DSB_K8S_POLICY": "{not json"})

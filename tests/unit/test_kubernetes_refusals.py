"""How the kubernetes provider names an API server's refusal of a sandbox Pod: RBAC (the operator's rights, a
configuration error) or admission (this Pod: a RuntimeClass the cluster lacks, PodSecurity, a webhook), which
no retry and no RBAC change mends. Messages are the API server's own wording (kube-apiserver 1.3x)."""

from __future__ import annotations

import json

import pytest
from kubernetes.aio.client.exceptions import ApiException

from durable_sandbox.providers.contract import ConfigurationError, ProvisionError
from durable_sandbox.providers.kubernetes import KubernetesProvider

WHAT = "create Pod demo/dsb-x"


def refusal(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return exc


@pytest.fixture
def provider() -> KubernetesProvider:
    return KubernetesProvider(namespace="demo", environ={})


def test_a_runtime_class_the_cluster_lacks_is_a_final_provision_error_naming_it(provider: KubernetesProvider) -> None:
    error = provider._provision_error(WHAT, refusal(403, 'pods "dsb-x" is forbidden: pod rejected: RuntimeClass '
                                                         '"kata" not found'))
    assert isinstance(error, ProvisionError) and not isinstance(error, ConfigurationError)
    assert error.retryable is False
    assert 'RuntimeClass "kata" not found' in str(error)
    assert "kubectl get runtimeclass" in str(error)
    assert "RBAC" not in str(error)


def test_pod_security_admission_is_a_final_provision_error(provider: KubernetesProvider) -> None:
    error = provider._provision_error(WHAT, refusal(403, 'pods "dsb-x" is forbidden: violates PodSecurity '
                                                         '"restricted:latest": runAsNonRoot != true'))
    assert isinstance(error, ProvisionError) and error.retryable is False
    assert "admission refused the Pod" in str(error) and "PodSecurity" in str(error)
    assert "runtimeclass" not in str(error)


def test_a_webhook_denial_is_a_final_provision_error(provider: KubernetesProvider) -> None:
    error = provider._provision_error(WHAT, refusal(403, 'admission webhook "policy.example.com" denied the '
                                                         'request: images must come from the mirror'))
    assert isinstance(error, ProvisionError) and error.retryable is False
    assert "policy.example.com" in str(error)


def test_rbac_is_still_a_configuration_error_about_the_operators_rights(provider: KubernetesProvider) -> None:
    error = provider._provision_error(WHAT, refusal(403, 'pods is forbidden: User "system:serviceaccount:dsb:op" '
                                                         'cannot create resource "pods" in API group "" in the '
                                                         'namespace "demo"'))
    assert isinstance(error, ConfigurationError)
    assert "RBAC" in str(error) and "watchNamespaces" in str(error)


def test_an_exceeded_quota_stays_retryable(provider: KubernetesProvider) -> None:
    error = provider._provision_error(WHAT, refusal(403, 'pods "dsb-x" is forbidden: exceeded quota: q, '
                                                         'requested: pods=1, used: pods=2, limited: pods=2'))
    assert isinstance(error, ProvisionError) and error.retryable is True


def test_the_handle_says_the_runtime_class_the_pod_has(provider: KubernetesProvider) -> None:
    pod = {"metadata": {"namespace": "demo", "name": "dsb-x", "annotations": {}},
           "spec": {"runtimeClassName": "gvisor"}}
    assert provider._handle(pod).metadata["runtimeClassName"] == "gvisor"
    plain = {"metadata": {"namespace": "demo", "name": "dsb-y", "annotations": {}}, "spec": {}}
    assert "runtimeClassName" not in provider._handle(plain).metadata

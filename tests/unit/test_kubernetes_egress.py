"""The operator's start-log line about sandbox Pods' egress (providers/kubernetes_egress.py, issue 32 item 7)."""

from __future__ import annotations

import logging

from durable_sandbox.providers.kubernetes_egress import ENV_EGRESS_POLICY, egress_notice


def test_without_the_charts_policy_the_operator_warns_that_nothing_limits_egress() -> None:
    for environ in ({}, {ENV_EGRESS_POLICY: " "}):
        level, message = egress_notice(environ)
        assert level == logging.WARNING
        assert "no NetworkPolicy of this installation limits the egress of sandbox Pods" in message
        assert "169.254.169.254" in message and "providers.kubernetes.networkPolicy.enabled" in message


def test_with_the_charts_policy_it_names_it_and_says_it_needs_an_enforcer() -> None:
    level, message = egress_notice({ENV_EGRESS_POLICY: "dsb-durable-sandbox-sandboxes"})
    assert level == logging.INFO
    assert "NetworkPolicy dsb-durable-sandbox-sandboxes" in message
    assert "enforced only if the cluster's network plugin enforces NetworkPolicy" in message


def test_no_template_takes_a_sandbox_pod_out_of_the_policys_selector() -> None:
    """The chart's policy selects durable-sandbox.dev/sandbox-pod=true: a template (the default, a Workflow's
    PodTemplate) asking to set it is refused, and the label on the Pod is the operator's whatever a template says."""
    from durable_sandbox.providers.kubernetes import SANDBOX_LABEL
    from durable_sandbox.providers.kubernetes_template import PodTemplate, TemplatePolicy

    escaping = PodTemplate.model_validate({"labels": {SANDBOX_LABEL: "false", "team": "a"}})
    assert escaping.problems(TemplatePolicy()) == [
        f"labels.{SANDBOX_LABEL}: the durable-sandbox.dev/ labels are the operator's own"]
    pod = escaping.pod(name="p", namespace="ns", labels={SANDBOX_LABEL: "true"}, annotations={}, env_secret=None)
    assert pod["metadata"]["labels"][SANDBOX_LABEL] == "true" and pod["metadata"]["labels"]["team"] == "a"

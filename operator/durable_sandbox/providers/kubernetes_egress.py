"""What limits the network egress of sandbox Pods, said once when the operator starts.

The NetworkPolicy itself is the chart's (charts/durable-sandbox/templates/networkpolicy.yaml): rendering it there
keeps NetworkPolicies out of the operator's rights. The chart tells the operator its name (``DSB_K8S_EGRESS_POLICY``);
an operator started without one says plainly that nothing limits what sandbox code can reach. Neither case can be
checked from here: whether a NetworkPolicy is enforced depends on the cluster's network plugin, which the API does
not reveal, so the message says that too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

ENV_EGRESS_POLICY = "DSB_K8S_EGRESS_POLICY"

__all__ = ["ENV_EGRESS_POLICY", "egress_notice"]


def egress_notice(environ: Mapping[str, str]) -> tuple[int, str]:
    """The log level and message about sandbox Pods' egress for an operator with this environment."""
    name = (environ.get(ENV_EGRESS_POLICY) or "").strip()
    if not name:
        return logging.WARNING, (
            f"kubernetes provider: no NetworkPolicy of this installation limits the egress of sandbox Pods "
            f"({ENV_EGRESS_POLICY} is unset): code in a sandbox reaches whatever the Pod network reaches (the API "
            "server, in-cluster services, the snapshot store, cloud metadata at 169.254.169.254). Install with the "
            "chart (providers.kubernetes.networkPolicy.enabled, the default) or apply its policy to each namespace: "
            "docs/kubernetes.md, \"Sandbox egress\"")
    return logging.INFO, (
        f"kubernetes provider: NetworkPolicy {name} in each watched namespace limits the egress of sandbox Pods "
        "(DNS, public addresses, and the chart's extra rules). It is enforced only if the cluster's network plugin "
        "enforces NetworkPolicy; on one that does not (the bridge plugin, flannel alone) it changes nothing")

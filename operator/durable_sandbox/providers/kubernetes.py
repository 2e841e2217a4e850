"""The ``kubernetes`` provider: a sandbox is a Pod, tool calls run through the API server's ``pods/exec``, and
snapshots of its workspace volume go to object storage through the S3 API.

Where things are:

* **The Pod** lives in the namespace of the sandbox's owner (the operator's owner tag is ``<namespace>/<uid>``
  of the Workflow or Sandbox), else in ``DSB_K8S_NAMESPACE`` (default: the kubeconfig context's namespace).
  It is made from a template (``providers/kubernetes_template.py``: the operator's default, a PodTemplate
  object, or an image) checked against the operator's policy, and named from the provision's operation id
  (``dsb-<digest>``), so a create repeated after a lost answer finds the same Pod, and an operator that
  restarts adopts what it made. Labels: the owner's, the installation's and the operation's keys
  (:func:`tag_key` digests: label values cannot hold ``/``), the run id where it is a valid label value; the
  full owner and spec labels, and the lease's expiry, are annotations.
* **The sandbox's env** (``spec.env``, may hold secrets) is a Secret of its own (``<pod>-env-<mac>``: a name
  only the operator computes, so none can be planted for it; ``envFrom``), owned by the Pod, so it goes when the
  Pod goes; never in the Pod's spec, a handle or a message.
* **Calls** are one exec each (``providers/kubernetes_exec.py``) of a fixed boot command that reads its script
  from stdin (``providers/kubernetes_scripts.py``): output is kept as the journal's head/tail rule says
  (``providers/output.py``), a timeout kills every process of the call in the Pod (by a tag in their
  environment) and answers exit 124, and a call's leftover background processes are killed when it ends.
* **Snapshots** are ``tar`` of the workspace volume (``/workspace``: not the container's root filesystem,
  not running processes), streamed from the exec to the store as it comes, and back into a fresh Pod for a
  restore; memory stays bounded whatever the size. Store settings and credentials come only from the
  operator's environment (``DSB_S3_*``, from the Secret the chart names): never from a Workflow, never
  into the sandbox. Without them the provider offers no snapshots (its capabilities say so).
* **Leases** are an annotation, renewed by ``renew_lease``; a Pod whose lease has run out is deleted when it
  is next touched and by every inventory (the orphan sweep), so a Pod nobody renews does not live on.
* **Identity** is a seal over the Pod's uid (``providers/kubernetes_identity.py``), never its labels: only
  the operator's sealed Pods are adopted, listed or deleted; every other Pod met is refused, visibly. Every
  exec (by name) is bracketed by reads of the Pod's uid (``providers/kubernetes_verification.py``): nothing is
  sent to, and no result believed from, a Pod re-created under the sandbox's name.

The code, one job per module, each a layer of the class: ``kubernetes_connection.py`` (state, the API client,
errors, reading Pods), ``kubernetes_adoption.py`` (create, adopt, seal, refuse, delete by identity),
``kubernetes_lifecycle.py`` (leases, loss, listings), ``kubernetes_verification.py`` (each exec goes to the
sealed Pod), ``kubernetes_calls.py`` (calls, the probe),
``kubernetes_warm.py`` (warm claims, pool Pods), ``kubernetes_provisioning.py`` (templates, env, new Pods;
``kubernetes_startup.py``: waiting for a new Pod to run, on a watch of it, identity by its uid),
``kubernetes_snapshots.py`` (snapshots, restores); this module: configuration and capabilities.
"""

from __future__ import annotations

from collections.abc import Mapping

from durable_sandbox.providers.archive_limit import configured_limit
from durable_sandbox.providers.contract import (
    TOOL_TYPES,
    Capability,
    ConfigurationError,
    ProviderCapabilities,
)
from durable_sandbox.providers.kubernetes_calls import TIMEOUT_EXIT_CODE
from durable_sandbox.providers.kubernetes_connection import (
    ENV_READY_TIMEOUT,
    ENV_SNAPSHOT_LIMIT,
    ENV_UNSCHEDULABLE_GRACE,
    HOPELESS_WAITING,
    LEASE_ANNOTATION,
    MAXIMUM_LEASE_SECONDS,
    SANDBOX_LABEL,
)
from durable_sandbox.providers.kubernetes_identity import META_ANNOTATION
from durable_sandbox.providers.kubernetes_provisioning import pod_name
from durable_sandbox.providers.kubernetes_snapshots import PodSnapshots
from durable_sandbox.providers.kubernetes_template import (
    PodTemplate,
    TemplatePolicy,
)
from durable_sandbox.providers.s3_snapshots import S3Config

__all__ = ["HOPELESS_WAITING", "LEASE_ANNOTATION", "META_ANNOTATION", "SANDBOX_LABEL", "TIMEOUT_EXIT_CODE",
           "KubernetesProvider", "pod_name"]

_ENV_DISABLED = "DSB_K8S_DISABLED"  # why the operator may not use this provider (the chart sets it)


class KubernetesProvider(PodSnapshots):
    """The provider: each layer below adds one job (see the module docstring for where things are)."""

    name = "kubernetes"

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        disabled = environ.get(_ENV_DISABLED)
        if disabled:
            return [f"Sandbox provider [kubernetes] is off in this operator: {disabled}"]
        problems = []
        try:
            template = PodTemplate.from_environ(environ)
            TemplatePolicy.from_environ(environ)
            configured_limit(environ, ENV_SNAPSHOT_LIMIT, template.workspace.size_limit, "the workspace's sizeLimit")
        except ConfigurationError as exc:
            problems.append(str(exc))
        if environ.get("DSB_S3_BUCKET") or environ.get("DSB_S3_ENDPOINT"):
            problems += S3Config.environ_problems(environ)
        for key in (ENV_READY_TIMEOUT, ENV_UNSCHEDULABLE_GRACE):
            raw = environ.get(key)
            if raw:
                try:
                    ok = float(raw) > 0
                except ValueError:
                    ok = False
                if not ok:
                    problems.append(f"Sandbox provider [kubernetes]: {key} must be a positive number of seconds, got {raw!r}")
        return problems

    def capabilities(self) -> ProviderCapabilities:
        supported = {Capability.LEASE_RECONCILIATION, Capability.INVENTORY, Capability.LOSS_INJECTION,
                     Capability.PROCESS_RESET, Capability.OUTPUT_STREAMING}
        if self.store is not None:
            supported |= {Capability.SNAPSHOT, Capability.SNAPSHOT_DELETION, Capability.SNAPSHOT_RECONCILIATION,
                          Capability.RESTORE, Capability.SNAPSHOT_COPY}
        return ProviderCapabilities(supported=frozenset(supported), delivery_guarantee="at_least_once_effects",
                                    idempotent_destroy=True, maximum_lease_seconds=MAXIMUM_LEASE_SECONDS,
                                    tool_types=TOOL_TYPES)

"""Waiting until the API server's discovery serves the operator's resources, before kopf reads it.

kopf decides which resources it serves from the API server's discovery (``/apis``, then
``/apis/<group>/<version>``), and a resource missing from it is dropped ("Unresolved resources cannot be
served (try creating their CRDs)") until kopf happens to read discovery again. An API server that has just
started answers discovery before it knows every CustomResourceDefinition: ``/apis`` without our group,
``/apis/durable-sandbox.dev/v1alpha1`` with 404 or with 503 ("the request has been made before all known
HTTP paths have been installed"). The operator therefore reads discovery exactly once, at start (kopf's
``settings.scanning.disabled``; a restarted API server then changes nothing, because nothing is read
again), and :func:`wait_until_served` holds that one read back until discovery is complete, and until a LIST of
each resource answers: right after its CRD is established, the API server answers 429 "storage is
(re)initializing" for a resource it lists in discovery, and kopf's watches met that (an ERROR line each) at every
start. One WARNING names what is waited for, then one every ``SAY_EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from durable_sandbox.kube.api.client import KubeClient, brief
from durable_sandbox.kube.api.resources import GROUP, JOURNALS, SERVED, VERSION

log = logging.getLogger("durable_sandbox.kube.api.discovery")

# What kopf needs of a resource to serve it with handlers that keep state (its own checks: watchable and
# patchable, else "Non-watchable/Non-patchable resources will not be served").
VERBS = frozenset({"list", "watch", "patch"})
FIRST_DELAY = 0.5
MAX_DELAY = 5.0
SAY_EVERY = 30.0  # seconds between repeated "still waiting" lines
QUIET_FOR = 3.0  # seconds of waiting said in one INFO line once served, not a WARNING
CRDS_OUTDATED = ("the CRDs installed are of an older version: a chart upgrade does not upgrade CRDs; "
                 "kubectl apply --server-side -f charts/durable-sandbox/crds/")
RBAC_LACKING = ("the operator may not list {plural} here: the chart's RBAC grants it (docs/operations.md, "
                "'RBAC: what the operator may do'); a Role made by hand needs get, list, watch and patch on it")
GENERIC_HINT = "an API server that has just started; or the CRDs are not installed: kubectl apply -f crds/"


@dataclass(frozen=True)
class Wanted:
    group: str = GROUP
    version: str = VERSION
    plurals: tuple[str, ...] = SERVED
    namespace: str | None = None  # where the operator's watches list (the first it serves); None: cluster-wide
    # Listed before going on: the served ones, and the Journal objects (every lease, and the API server journal).
    listed: tuple[str, ...] = (*SERVED, JOURNALS)

    def describe(self) -> str:
        return f"{', '.join(self.plurals)} of {self.group}/{self.version}"


async def list_one(api: KubeClient, wanted: Wanted, plural: str) -> object:
    """A LIST of ``plural`` as kopf's watch starts with (one item at most): it answers once its storage is ready."""
    if wanted.namespace is None:
        return await api.custom.list_cluster_custom_object(wanted.group, wanted.version, plural, limit=1)
    return await api.custom.list_namespaced_custom_object(wanted.group, wanted.version, wanted.namespace, plural,
                                                          limit=1)


async def missing(api: KubeClient, wanted: Wanted = Wanted()) -> tuple[str, str] | None:
    """None when discovery lists every wanted resource with the verbs kopf needs and each LISTs, else what is
    missing and what to do about it."""
    try:
        groups = await api.apis.get_api_versions()
    except Exception as exc:  # a starting or unreachable API server: reported, and asked again
        return f"GET /apis: {brief(exc)}", GENERIC_HINT
    listed = next((g for g in groups.groups or [] if g.name == wanted.group), None)
    if listed is None:
        return f"/apis does not list the group {wanted.group} yet", GENERIC_HINT
    if wanted.version not in {v.version for v in listed.versions or []}:
        return f"/apis lists no version {wanted.version} of {wanted.group} yet", GENERIC_HINT
    path = f"/apis/{wanted.group}/{wanted.version}"
    try:
        resources = await api.custom.get_api_resources(wanted.group, wanted.version)
    except Exception as exc:
        return f"GET {path}: {brief(exc)}", GENERIC_HINT
    served = {r.name: set(r.verbs or []) for r in resources.resources or []}
    lacking = [p for p in wanted.plurals if p not in served]
    if lacking:
        # Some of the group's kinds are there and others are not: CRDs of an older version (Helm installs crds/
        # on the first install only), not an API server still starting. The old replicas keep serving meanwhile:
        # this one stays unready rather than serve part of what it should.
        return f"{path} does not list {', '.join(lacking)} yet", CRDS_OUTDATED if served else GENERIC_HINT
    short = [f"{p} ({', '.join(sorted(VERBS - served[p]))})" for p in wanted.plurals if not VERBS <= served[p]]
    if short:
        return f"{path} lists without the verbs kopf needs: {'; '.join(short)}", GENERIC_HINT
    for plural in wanted.listed:
        try:
            await list_one(api, wanted, plural)
        except Exception as exc:
            where = f"namespaces/{wanted.namespace}/" if wanted.namespace else ""
            hint = RBAC_LACKING.format(plural=plural) if getattr(exc, "status", None) == 403 else GENERIC_HINT
            return f"LIST {path}/{where}{plural}: {brief(exc)}", hint
    return None


def _delays(first: float, most: float) -> Iterable[float]:
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


async def wait_until_served(api: KubeClient, wanted: Wanted = Wanted(), *, first_delay: float = FIRST_DELAY,
                            max_delay: float = MAX_DELAY) -> None:
    """Return once discovery serves every wanted resource; until then ask again with a backoff. A wait shorter
    than ``QUIET_FOR`` (every start right after the CRDs are applied) is one INFO line saying what it waited for;
    a longer one is a WARNING naming it, repeated every ``SAY_EVERY`` seconds. It does not give up: an operator
    that started without its resources would serve nothing until restarted, and the CRDs may be installed after
    the operator (then apply them)."""
    started = time.monotonic()
    said = 0.0
    first: str | None = None
    for delay in _delays(first_delay, max_delay):
        answer = await missing(api, wanted)
        now = time.monotonic()
        if answer is None:
            if said:
                log.info("the API server serves %s now (waited %.1fs)", wanted.describe(), now - started)
            elif first is not None:
                log.info("the API server serves %s (waited %.1fs: %s)", wanted.describe(), now - started, first)
            return
        why, hint = answer
        first = first or why
        if now - started >= QUIET_FOR and (not said or now - said >= SAY_EVERY):
            log.warning("waiting for the API server to serve %s before serving them: %s (%s)", wanted.describe(),
                        why, hint)
            said = now
        await asyncio.sleep(delay)

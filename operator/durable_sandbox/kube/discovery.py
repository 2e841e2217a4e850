"""Waiting until the API server's discovery serves the operator's resources, before kopf reads it.

kopf decides which resources it serves from the API server's discovery (``/apis``, then
``/apis/<group>/<version>``), and a resource missing from it is dropped ("Unresolved resources cannot be
served (try creating their CRDs)") until kopf happens to read discovery again. An API server that has just
started answers discovery before it knows every CustomResourceDefinition: ``/apis`` without our group,
``/apis/durable-sandbox.dev/v1alpha1`` with 404 or with 503 ("the request has been made before all known
HTTP paths have been installed"). The operator therefore reads discovery exactly once, at start (kopf's
``settings.scanning.disabled``; a restarted API server then changes nothing, because nothing is read
again), and :func:`wait_until_served` holds that one read back until discovery is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from durable_sandbox.kube.client import ApiException, KubeClient
from durable_sandbox.kube.resources import GROUP, SERVED, VERSION

log = logging.getLogger("durable_sandbox.kube.discovery")

# What kopf needs of a resource to serve it with handlers that keep state (its own checks: watchable and
# patchable, else "Non-watchable/Non-patchable resources will not be served").
VERBS = frozenset({"list", "watch", "patch"})
FIRST_DELAY = 0.5
MAX_DELAY = 5.0
SAY_EVERY = 30.0  # seconds between repeated "still waiting" lines


@dataclass(frozen=True)
class Wanted:
    group: str = GROUP
    version: str = VERSION
    plurals: tuple[str, ...] = SERVED

    def describe(self) -> str:
        return f"{', '.join(self.plurals)} of {self.group}/{self.version}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        message = exc.body if isinstance(exc.body, str) else ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(message).get("message") or message  # a Status: its message says it all
        return f"HTTP {exc.status} {exc.reason or ''}".rstrip() + (f": {message.strip()[:300]}" if message else "")
    return f"{type(exc).__name__}: {exc}"


async def missing(api: KubeClient, wanted: Wanted = Wanted()) -> str | None:
    """None when discovery lists every wanted resource with the verbs kopf needs, else what is missing."""
    try:
        groups = await api.apis.get_api_versions()
    except Exception as exc:  # a starting or unreachable API server: reported, and asked again
        return f"GET /apis: {_why(exc)}"
    listed = next((g for g in groups.groups or [] if g.name == wanted.group), None)
    if listed is None:
        return f"/apis does not list the group {wanted.group} yet"
    if wanted.version not in {v.version for v in listed.versions or []}:
        return f"/apis lists no version {wanted.version} of {wanted.group} yet"
    path = f"/apis/{wanted.group}/{wanted.version}"
    try:
        resources = await api.custom.get_api_resources(wanted.group, wanted.version)
    except Exception as exc:
        return f"GET {path}: {_why(exc)}"
    served = {r.name: set(r.verbs or []) for r in resources.resources or []}
    lacking = [p for p in wanted.plurals if p not in served]
    if lacking:
        return f"{path} does not list {', '.join(lacking)} yet"
    short = [f"{p} ({', '.join(sorted(VERBS - served[p]))})" for p in wanted.plurals if not VERBS <= served[p]]
    if short:
        return f"{path} lists without the verbs kopf needs: {'; '.join(short)}"
    return None


def _delays(first: float, most: float) -> Iterable[float]:
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


async def wait_until_served(api: KubeClient, wanted: Wanted = Wanted(), *, first_delay: float = FIRST_DELAY,
                            max_delay: float = MAX_DELAY) -> None:
    """Return once discovery serves every wanted resource; until then ask again with a backoff, saying why
    every ``SAY_EVERY`` seconds. It does not give up: an operator that started without its resources would
    serve nothing until restarted, and the CRDs may be installed after the operator (then apply them)."""
    started = time.monotonic()
    said = 0.0
    for delay in _delays(first_delay, max_delay):
        why = await missing(api, wanted)
        if why is None:
            if said:
                log.info("the API server serves %s now (waited %.1fs)", wanted.describe(), time.monotonic() - started)
            return
        now = time.monotonic()
        if not said or now - said >= SAY_EVERY:
            log.warning("waiting for the API server to serve %s before serving them: %s (an API server that has "
                        "just started; or the CRDs are not installed: kubectl apply -f crds/)", wanted.describe(), why)
            said = now
        await asyncio.sleep(delay)

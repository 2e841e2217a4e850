"""What every room of the Sandbox controller shares: the API, the Sandbox records, the providers (one per
name, made on first use), the views of the Sandboxes this replica serves, and the secrets a spec names.

The controller is this class and a room per job above it (``status.py``, ``lease.py``, ``operations.py``,
``live.py``, ``suspend.py``, ``idle_suspend.py``, ``turn.py``, ``finalizer.py``), each a layer of
:class:`~durable_sandbox.kube.sandbox.controller.SandboxController`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.resources import (
    API_VERSION,
    OPERATOR_FIELD_MANAGER,
    CustomObjects,
)
from durable_sandbox.kube.holders.holding import Holding
from durable_sandbox.kube.journal.leases import ObjectLeases
from durable_sandbox.kube.journal.sandbox_records import (
    HOLDER,
    RECORDED,
    SandboxRecords,
)
from durable_sandbox.kube.reporting.events import EventRecorder
from durable_sandbox.kube.sandbox.view import (
    SANDBOX_LABEL,
    SandboxControllerSettings,
    SandboxView,
)
from durable_sandbox.kube.spec.conditions import SANDBOX_CONDITIONS
from durable_sandbox.kube.spec.models import SandboxResource
from durable_sandbox.kube.spec.secrets import read_secret_values, secret_refs
from durable_sandbox.kube.store.journals import JournalStores
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider

__all__ = ["CONDITION_ORDER", "STEPS", "SandboxBase", "handle_metadata", "shown_status"]

# The Events that are steps of a Sandbox's life: each is also a line of the lifecycle log (INFO, as a run's are).
STEPS = frozenset({"Provisioned", "SnapshotTaken", "SnapshotDeleted", "SandboxLost", "Recovered", "IdleSuspended",
                   "Resumed", "CleanupDone"})
CONDITION_ORDER = SANDBOX_CONDITIONS


def shown_status(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """What of a Sandbox's status the controller keeps from the API server: everything but what it acts on
    (that comes from the Sandbox's record only) and the holder (the record's, shown there by kube/holders/holding.py)."""
    return {k: v for k, v in (status or {}).items() if k not in RECORDED and k != HOLDER}


def handle_metadata(handle: SandboxHandle) -> dict[str, Any]:
    return dict(handle.metadata)


class SandboxBase:
    """The controller's state; each layer above adds one job."""

    def __init__(
        self,
        api: KubeClient,
        events: EventRecorder,
        provider: Callable[[str], SandboxProvider],
        settings: SandboxControllerSettings | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        records: SandboxRecords,
        holding: Holding,
        journals: JournalStores | None = None,
    ) -> None:
        self.api = api
        # Where the Sandboxes' own call journals are (sessions/): deleted with their Sandbox, unless the journal
        # store collects them by owner reference (the API server's) and deleting here would race the collector.
        self.journals = journals
        self.records = records
        self.holding = holding
        self.objects = CustomObjects(api)
        self.events = events
        self.labels = dict(labels or {})  # on every sandbox provisioned (the installation label: orphan sweeps)
        self._provider_of = provider
        self._providers: dict[str, SandboxProvider] = {}
        self.settings = settings or SandboxControllerSettings()
        self._views: dict[str, SandboxView] = {}  # uid -> view
        self._leases = ObjectLeases(api, field_manager=OPERATOR_FIELD_MANAGER, api_version=API_VERSION, kind="Sandbox",
                                    prefix="dsbx", name_label=SANDBOX_LABEL)

    def provider(self, name: str) -> SandboxProvider:
        found = self._providers.get(name)
        if found is None:
            found = self._providers[name] = self._provider_of(name)
        return found

    def _view(self, body: Mapping[str, Any], body_of: Callable[[], Mapping[str, Any]] | None = None) -> SandboxView:
        meta = body["metadata"]
        view = self._views.get(meta["uid"])
        if view is None:
            view = SandboxView(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], body=body,
                               status=shown_status(body.get("status")))
            self._views[view.uid] = view
        view.body = body
        if body_of is not None:
            view.body_of = body_of
        return view

    async def _secrets(self, view: SandboxView, res: SandboxResource) -> dict[tuple[str, str], str]:
        return await read_secret_values(self.api.core, view.namespace, secret_refs(res.spec.env), where="spec.env")

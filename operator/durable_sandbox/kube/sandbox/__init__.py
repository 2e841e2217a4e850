"""The Sandbox controller: one long-lived provider sandbox per ``Sandbox`` resource (``controller.py``), and
what it keeps of each (``view.py``). Its rooms, one job each and each a layer of the controller: ``base.py``
(state, providers, views), ``status.py`` (record, status, Events), ``lease.py`` (one replica reconciles),
``operations.py`` (intent, then effect; provision and adoption), ``checkpoints.py`` (the session calls'
snapshots and the lineage the session reads), ``live.py`` (renewal, loss and recovery),
``suspend.py`` (``spec.suspend``), ``idle_suspend.py`` (the idle timer, planned by ``idle.py``), ``turn.py``
(one reconciliation), ``finalizer.py`` (deletion). A peer of the Workflow controller (``kube/workflow/``): neither
imports the other; what they share is below both (``kube/api/objects.py``, ``kube/holders/holding.py``,
``kube/spec/conditions.py``, ``kube/api/errors.py``, ``kube/api/resources.py``)."""

from durable_sandbox.kube.sandbox.controller import SandboxController
from durable_sandbox.kube.sandbox.view import SandboxControllerSettings, SandboxView

__all__ = ["SandboxController", "SandboxControllerSettings", "SandboxView"]

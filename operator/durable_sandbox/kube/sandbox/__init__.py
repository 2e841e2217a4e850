"""The Sandbox controller: one long-lived provider sandbox per ``Sandbox`` resource (``controller.py``), and
what it keeps of each (``view.py``). A peer of the Workflow controller (``kube/workflow/``): neither
imports the other; what they share is below both (``kube/objects.py``, ``kube/holding.py``,
``kube/conditions.py``, ``kube/errors.py``, ``kube/resources.py``)."""

from durable_sandbox.kube.sandbox.controller import SandboxController
from durable_sandbox.kube.sandbox.view import SandboxControllerSettings, SandboxView

__all__ = ["SandboxController", "SandboxControllerSettings", "SandboxView"]

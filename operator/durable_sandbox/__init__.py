"""durable-sandbox: durable AI-agent workflows against sandboxes.

``durable_sandbox.Engine`` is the engine with sandbox sessions wired in (``ctx.sandbox``); the bare
engine (``durable_sandbox.engine.Engine``) knows nothing of sandboxes or providers.

The public names resolve lazily (PEP 562): importing a submodule such as ``durable_sandbox.providers.contract``
runs this file first, and a provider package must not pay for (or depend on) the engine it never uses.
Code inside the package imports each name from its defining module, never from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from durable_sandbox.lazy_names import lazy_names

if TYPE_CHECKING:
    from durable_sandbox.engine import (
        CallbackTimeout,
        ChildPolicy,
        ChildWorkflowFailed,
        Context,
        NonDeterminismError,
        ParallelError,
        QueryRefused,
        RetryPolicy,
        RunState,
        RunStatus,
        SignalConflict,
        StepFailed,
        StepTimeout,
        UpdateConflict,
        UpdateOutcome,
        UpdateRefused,
        workflow,
    )
    from durable_sandbox.sandbox_engine import Engine

__version__ = "0.1.0"

# public name -> the module that defines it
_ORIGIN: Final[Mapping[str, str]] = {
    "CallbackTimeout": "durable_sandbox.engine",
    "ChildPolicy": "durable_sandbox.engine",
    "ChildWorkflowFailed": "durable_sandbox.engine",
    "Context": "durable_sandbox.engine",
    "Engine": "durable_sandbox.sandbox_engine",
    "NonDeterminismError": "durable_sandbox.engine",
    "ParallelError": "durable_sandbox.engine",
    "QueryRefused": "durable_sandbox.engine",
    "RetryPolicy": "durable_sandbox.engine",
    "RunState": "durable_sandbox.engine",
    "RunStatus": "durable_sandbox.engine",
    "SignalConflict": "durable_sandbox.engine",
    "StepFailed": "durable_sandbox.engine",
    "StepTimeout": "durable_sandbox.engine",
    "UpdateConflict": "durable_sandbox.engine",
    "UpdateOutcome": "durable_sandbox.engine",
    "UpdateRefused": "durable_sandbox.engine",
    "workflow": "durable_sandbox.engine",
}

__all__ = [
    "CallbackTimeout",
    "ChildPolicy",
    "ChildWorkflowFailed",
    "Context",
    "Engine",
    "NonDeterminismError",
    "ParallelError",
    "QueryRefused",
    "RetryPolicy",
    "RunState",
    "RunStatus",
    "SignalConflict",
    "StepFailed",
    "StepTimeout",
    "UpdateConflict",
    "UpdateOutcome",
    "UpdateRefused",
    "workflow",
]


__getattr__, __dir__ = lazy_names(__name__, globals(), _ORIGIN)

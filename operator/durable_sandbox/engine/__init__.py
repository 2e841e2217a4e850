"""The durable execution engine: runs, journal, replay, context API, store protocol."""

from durable_sandbox.engine.children import ChildHandle, ChildPolicy, ChildWorkflowFailed
from durable_sandbox.engine.client import RunClient
from durable_sandbox.engine.context import Context
from durable_sandbox.engine.engine import Engine, new_run_id
from durable_sandbox.engine.errors import (
    AlreadyExecuting,
    CallbackTimeout,
    DuplicateOperationError,
    Handover,
    JournalDamaged,
    LeaseHeld,
    LeaseLost,
    NonDeterminismError,
    NotRunnableHere,
    ParallelError,
    QueryRefused,
    RunConflict,
    RunNotFinished,
    RunNotFound,
    SerializationError,
    SignalConflict,
    StepFailed,
    StepTimeout,
    StoreError,
    StoreRefused,
    UpdateConflict,
    UpdateRefused,
    WorkflowNotFound,
)
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.policies import RetryPolicy
from durable_sandbox.engine.records import Event, OperationRecord, OpKind, OpStatus, RunRecord, RunStatus
from durable_sandbox.engine.state import RunState
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.updates import RunHandlerAccess, UpdateOutcome
from durable_sandbox.engine.workflow import WorkflowDefinition, resolve, workflow

__all__ = [
    "AlreadyExecuting",
    "CallbackTimeout",
    "ChildHandle",
    "ChildPolicy",
    "ChildWorkflowFailed",
    "Context",
    "DuplicateOperationError",
    "Engine",
    "Event",
    "Handover",
    "JournalDamaged",
    "LeaseHeld",
    "LeaseLost",
    "NonDeterminismError",
    "NotRunnableHere",
    "OpKind",
    "OpStatus",
    "OperationRecord",
    "ParallelError",
    "QueryRefused",
    "RetryPolicy",
    "RunClient",
    "RunConflict",
    "RunExecutor",
    "RunHandlerAccess",
    "RunNotFinished",
    "RunNotFound",
    "RunRecord",
    "RunState",
    "RunStatus",
    "SerializationError",
    "SignalConflict",
    "StepFailed",
    "StepTimeout",
    "Store",
    "StoreError",
    "StoreRefused",
    "UpdateConflict",
    "UpdateOutcome",
    "UpdateRefused",
    "WorkflowDefinition",
    "WorkflowNotFound",
    "new_run_id",
    "resolve",
    "workflow",
]

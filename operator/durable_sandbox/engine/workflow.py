"""The ``@workflow`` decorator and workflow lookup by name or ``module:function`` reference."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from durable_sandbox.engine.errors import InvalidInput, NotAWorkflow, WorkflowNotFound
from durable_sandbox.engine.inputs import InputParameter, describe_mismatch, input_parameter

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# How a run moves between worker builds (engine/builds.py): "pinned" runs are executed only by workers of the
# build that started them; "auto-upgrade" runs move to whichever build executes them next (their code guards
# every change with ctx.patched).
Versioning = Literal["pinned", "auto-upgrade"]
VERSIONINGS: tuple[Versioning, ...] = ("pinned", "auto-upgrade")

_REGISTRY: dict[str, WorkflowDefinition] = {}


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    version: str
    fn: Callable[..., Awaitable[Any]]
    input: InputParameter | None  # None: the workflow takes no input (only the context)
    versioning: Versioning = "pinned"

    @property
    def ref(self) -> str | None:
        """``module:qualname`` if the function can be imported by that path (not a local function)."""
        qualname = getattr(self.fn, "__qualname__", "")
        if "<locals>" in qualname or not getattr(self.fn, "__module__", None):
            return None
        return f"{self.fn.__module__}:{qualname}"

    def prepare_input(self, raw: Any) -> tuple[Any, ...]:
        """The arguments after the context: the input as its parameter's annotation makes it (pydantic's
        ``ValidationError`` when it does not fit; :meth:`check_input` says so in one line)."""
        if self.input is None:
            return ()
        return (raw if self.input.adapter is None else self.input.adapter.validate_python(raw),)

    def check_input(self, raw: Any, *, root: str = "input") -> None:
        """``InvalidInput`` in one line naming the place, what was expected and what was given, and the
        parameter (``root`` is how the message names the input: ``spec.input`` in a manifest)."""
        try:
            self.prepare_input(raw)
        except ValidationError as exc:
            assert self.input is not None  # only a parameter's annotation validates
            raise InvalidInput(describe_mismatch(exc, raw, self.input.label, root)) from None


def _define(fn: Callable[..., Awaitable[Any]], name: str | None, version: str,
            versioning: Versioning = "pinned") -> WorkflowDefinition:
    if versioning not in VERSIONINGS:
        raise ValueError(f"@workflow(versioning={versioning!r}) on {fn.__qualname__}: give one of "
                         f"{', '.join(VERSIONINGS)}")
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@workflow needs an async function; {fn.__qualname__} is not `async def`.")
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        raise TypeError(f"Workflow {fn.__qualname__} must take the context as its first parameter.")
    return WorkflowDefinition(
        name=name or f"{fn.__module__}:{fn.__qualname__}",
        version=version,
        fn=fn,
        input=input_parameter(fn, params[1]) if len(params) >= 2 else None,
        versioning=versioning,
    )


def workflow(fn: F | None = None, *, name: str | None = None, version: str = "1",
             versioning: Versioning = "pinned") -> Any:
    """Mark an async function ``fn(ctx, input)`` as a durable workflow and register it by name.

    ``versioning`` says what a worker of another build does with a run this workflow started (engine/builds.py):
    ``"pinned"`` leaves it to the workers of the run's build; ``"auto-upgrade"`` executes it (its code guards
    every change with ``ctx.patched``) and pins it to the new build."""

    def wrap(f: F) -> F:
        definition = _define(f, name, version, versioning)
        existing = _REGISTRY.get(definition.name)
        if existing is not None and existing.fn.__code__ is not f.__code__ and existing.fn.__module__ != f.__module__:
            raise ValueError(
                f"Workflow name {definition.name!r} is already registered by {existing.fn.__module__}; "
                f"names must be unique."
            )
        _REGISTRY[definition.name] = definition
        f.__durable_workflow__ = definition  # type: ignore[attr-defined]
        return f

    return wrap(fn) if fn is not None else wrap


def definition_of(target: Any) -> WorkflowDefinition:
    if isinstance(target, WorkflowDefinition):
        return target
    if isinstance(target, str):
        return resolve(target)
    definition = getattr(target, "__durable_workflow__", None)
    if definition is None:
        if callable(target) and inspect.iscoroutinefunction(target):
            return _define(target, None, "1")
        raise TypeError(f"{target!r} is not a workflow; decorate it with @durable_sandbox.workflow.")
    return definition


def registered() -> tuple[WorkflowDefinition, ...]:
    """The workflows registered in this process so far (by ``@workflow`` or an import ``resolve`` made)."""
    return tuple(_REGISTRY.values())


def resolve(ref: str) -> WorkflowDefinition:
    """Find a workflow by registered name, or import ``package.module:function``."""
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(_REGISTRY)) or "none registered in this process"
        raise WorkflowNotFound(
            f"Unknown workflow {ref!r}: give a registered name ({known}) or a 'package.module:function' reference."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkflowNotFound(f"Cannot import module {module_name!r} for workflow {ref!r}: {exc}") from exc
    if ref in _REGISTRY:  # the import registered it under its default name
        return _REGISTRY[ref]
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise WorkflowNotFound(f"Module {module_name!r} has no attribute {attr!r} (workflow {ref!r}).")
    try:
        return definition_of(obj)
    except TypeError:
        raise NotAWorkflow(
            f"{ref} is not a workflow (it is {type(obj).__name__} {getattr(obj, '__qualname__', '')}); point at an "
            f"async function decorated with @durable_sandbox.workflow."
        ) from None


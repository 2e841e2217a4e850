"""The engine's extension points, typed: how the records of the extension behind ``ctx.sandbox`` read
(:class:`JournalReader`), and the values the process driving runs hands to extensions above the engine
(:class:`Extensions`). What the engine calls of that extension at a run's turning points is
``engine.executor.RunHooks``.

The engine knows nothing of sandboxes, providers or Workflows: an extension defines its own values as a
dataclass (``sandboxes.session.SandboxServices``, ``workflows.sandbox_agent.AgentServices``), whoever builds
the engine passes instances (``Engine(extensions=[...])``), and the extension reads its own back by type
(``rt.extensions.get(SandboxServices)``). mypy checks both sides: a misspelt field or type is an error where
it is written and where it is read, never a hook that silently does not run (tests/unit/test_extensions.py
shows mypy failing on one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from durable_sandbox.engine.records import OperationRecord

__all__ = ["GENERIC_JOURNAL", "Extensions", "JournalReader"]

T = TypeVar("T")


class JournalReader(Protocol):
    """How the records an extension writes read, for what the engine shows of a run (``RunState``,
    ``Engine.stream``): the sandbox sessions' is ``sandboxes.journal.SandboxJournal``, the only place that
    knows their schema. Without one the engine shows every record generically."""

    def target(self, row: OperationRecord) -> str | None:
        """What the operation works on (a sandbox call's command or path), for people."""

    def event(self, row: OperationRecord) -> dict[str, Any] | None:
        """The stream event of one of the extension's records: its ``type`` and any fields to add (None: not
        the extension's record, or nothing to say beyond the generic event)."""

    def snapshots(self, rows: Iterable[OperationRecord]) -> list[str]:
        """The live snapshots a run's records leave (``RunState.snapshots``)."""

    def recoveries(self, rows: Iterable[OperationRecord]) -> int:
        """How many times the run recovered from a lost sandbox (``RunState.recoveryCount``)."""


class _GenericJournal:
    """The reader of an engine without extensions: no record is anyone's. No state (no slots): one for all."""

    __slots__ = ()

    def target(self, row: OperationRecord) -> str | None:
        return None

    def event(self, row: OperationRecord) -> dict[str, Any] | None:
        return None

    def snapshots(self, rows: Iterable[OperationRecord]) -> list[str]:
        return []

    def recoveries(self, rows: Iterable[OperationRecord]) -> int:
        return 0


GENERIC_JOURNAL: JournalReader = _GenericJournal()


class Extensions:
    """Values for the engine's extensions, one per type; the engine carries them and never looks inside."""

    def __init__(self, values: Iterable[object] = ()) -> None:
        self._values: dict[type, object] = {}
        for value in values:
            if type(value) in self._values:
                raise ValueError(f"two extension values of type {type(value).__name__}; give one")
            self._values[type(value)] = value

    def get(self, kind: type[T]) -> T | None:
        """The value of type ``kind``, or None when whoever built the engine gave none."""
        value = self._values.get(kind)
        return value if isinstance(value, kind) else None

    def __repr__(self) -> str:
        return f"Extensions({', '.join(t.__name__ for t in self._values)})"

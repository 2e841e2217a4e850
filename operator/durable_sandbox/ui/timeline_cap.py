"""Keeping only the newest items of a timeline (a Sandbox's session may go on for days): the oldest finished
items are dropped and counted, and the page says how many it left out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

__all__ = ["ItemCap"]


class Capped(Protocol):
    """What the cap reads of a timeline item (ui/timeline.py's ``Item``)."""

    @property
    def key(self) -> str: ...
    @property
    def t1(self) -> float | None: ...
    @property
    def outcome(self) -> str: ...
    @property
    def src(self) -> int: ...
    @property
    def op(self) -> str | None: ...


T = TypeVar("T", bound=Capped)


@dataclass
class ItemCap:
    cap: int
    omitted: int = 0  # items dropped, oldest first
    evicted: list[str] = field(default_factory=list)  # op ids of dropped items, until taken
    gone: set[str] = field(default_factory=set)  # Kubernetes Event items dropped (their LIST returns them again)

    def trim(self, items: dict[str, T], in_order: Callable[[], Sequence[T]]) -> None:
        """Drop the oldest items beyond the cap, but those in flight (they end later, and their ends are shown)."""
        excess = len(items) - self.cap
        if excess <= 0:
            return
        for item in in_order():
            if excess <= 0:
                break
            if item.t1 is None and item.outcome in ("running", "waiting"):
                continue
            del items[item.key]
            self.omitted += 1
            excess -= 1
            if item.src == 2:
                self.gone.add(item.key)
            elif item.op is not None:
                self.evicted.append(item.op)

    def take_evicted(self, items: dict[str, T]) -> set[str]:
        """The op ids of the items dropped since the last call that no kept item has (their records can go)."""
        dropped, self.evicted = set(self.evicted), []
        return dropped - {i.op for i in items.values() if i.op is not None} if dropped else set()

"""What rebuilding a lost sandbox does with each completed call: rerun it, skip it, or ask (``onReplay``).

A call journaled with ``onReplay: skip`` is not executed again (its journaled result stands); one with ``ask`` waits on
the callback ``replay:<op id>`` first, *before* anything is made: the whole restore waits with no sandbox live, so a
wait of days holds nothing and a crash while waiting leaks nothing. Only a signal answers it."""

from __future__ import annotations

import logging
from typing import NamedTuple

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import DurableError, Suspend
from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.serialization import value_digest
from durable_sandbox.providers.contract import ToolCall, ToolResult
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.call_records import result_from
from durable_sandbox.sandboxes.errors import ReplayAnswerInvalid
from durable_sandbox.sandboxes.scope import SessionScope

log = logging.getLogger("durable_sandbox.sandboxes")


class Replay(NamedTuple):
    position: int  # the call's place in the session's order
    op_id: str
    recorded: ToolResult
    rerun: bool  # False: skipped (its journaled result stands)


class ReplayPlanner:
    def __init__(self, scope: SessionScope) -> None:
        self.scope = scope
        # The calls issued in this process, with their env values, which the journal does not keep (for replay).
        self.calls: dict[str, ToolCall] = {}
        # The answers to the session's replay callbacks, once read (a second recovery in the same execution
        # reuses them: an answer is for the call, for the whole run). The callbacks are written only while
        # recovering, so a later execution that needs no recovery never meets them: not a change of code.
        self._answers: dict[str, str] = {}
        for ask in journal.asks_of(scope.sid, scope.rt.first):
            scope.rt.reached(ask)

    async def plan(self, first: int) -> tuple[list[Replay], dict[str, str]]:
        """Every completed call from ``first`` on, in order, and the answers of the asked ones. Every ask not
        answered yet is journaled as a pending callback, all at once, then the run waits (``Suspend``) on all."""
        state = self.scope.state
        plan: list[Replay] = []
        asked: dict[str, str] = {}
        waiting: list[str] = []
        for index in range(first, state.completed):
            op, journaled = state.calls[index]
            policy = state.policies.get(op, journal.ON_REPLAY_RERUN)
            if policy == journal.ON_REPLAY_ASK:
                answer = await self._answer(op, index)
                if answer is None:
                    waiting.append(journal.ask_id(op))
                    continue
                asked[op] = answer
                policy = answer
            plan.append(Replay(index, op, result_from(journaled), policy == journal.ON_REPLAY_RERUN))
        if waiting:
            log.info("sandbox %s: replay waits for %s (answer rerun or skip)", self.scope.sid, ", ".join(waiting))
            raise Suspend(waiting)
        return plan, asked

    def _payload(self, op: str, index: int) -> dict[str, object]:
        """What the replay callback of call ``op`` shows whoever answers it."""
        started = self.scope.rt.first.get(op)
        recorded = ((started.meta or {}).get(journal.META_CALL) if started is not None else None) or {}
        return {"call": op, "index": index, "type": recorded.get("type"),
                "target": journal.call_target(started) if started is not None else None,
                "answers": list(journal.ANSWERS),
                "why": "the sandbox was lost and is being rebuilt; answer rerun to execute this call again, "
                       "or skip to keep its journaled result without executing it"}

    async def _answer(self, op: str, index: int) -> str | None:
        """The answer to the replay callback of call ``op``: journaled, signalled (then journaled), or None
        (the callback is journaled as pending). Only a signal (``dsb signal``, the Workflow's spec.signals)
        answers it."""
        ask = journal.ask_id(op)
        if ask in self._answers:
            return self._answers[ask]
        rt = self.scope.rt
        rec = rt.lookup(ask)
        if rec is not None and rec.kind != OpKind.CALLBACK.value:
            raise DurableError(
                f"Sandbox {self.scope.sid!r}: {ask!r} is taken by a {rec.kind} operation; rename that operation")
        payload = self._payload(op, index)
        digest = value_digest(payload)
        if rec is not None and rec.status == "completed":
            value = rec.result
        else:
            if ask not in rt.signals:  # a signal may have come while this execution ran
                rt.signals.update(await rt.store.get_signals(rt.run_id))
            if ask not in rt.signals:
                if rec is None or rec.status != "started":
                    await rt.write(OperationRecord(ask, OpKind.CALLBACK.value, ask, "started", 1, digest,
                                                   meta={"payload": payload, "deadline": None}, epoch=rt.epoch))
                    faults.reach(f"asked:{ask}")
                return None
            value = rt.signals[ask]
            await rt.write(OperationRecord(ask, OpKind.CALLBACK.value, ask, "completed", 1, digest, value, epoch=rt.epoch))
        rt.reached(ask)
        if value not in journal.ANSWERS:
            raise ReplayAnswerInvalid(ask, value)
        self._answers[ask] = value
        return str(value)

    def recorded_call(self, op_id: str, index: int) -> ToolCall:
        """The call ``op_id`` as it was issued, to execute again into a replacement."""
        # The workflow re-issues its own calls in order before any later one can need a recovery, so those
        # were seen in this process, env values included; the calls of agent tools replayed from the journal
        # were not (call_scope.py): the journal is their source.
        if op_id in self.calls:
            return self.calls[op_id]
        sid = self.scope.sid
        rec = self.scope.rt.first.get(op_id)
        args = (rec.meta or {}).get("call") if rec else None
        if args is None:
            raise DurableError(f"Sandbox {sid!r}: call {op_id} has no recorded arguments to replay")
        if args["args"].get("env"):
            raise DurableError(
                f"Sandbox {sid!r}: call {op_id} set env values, which the journal does not keep; it can only "
                f"be replayed after the workflow issues it again (a call made inside an agent tool that was "
                f"replayed from the journal is not issued again): give such values to the session "
                f"(ctx.sandbox(..., env=)), not to a call"
            )
        return ToolCall(operation_id=self.scope.local(op_id), type=args["type"], args=args["args"])

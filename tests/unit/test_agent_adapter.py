"""The checkpointed agent adapter: one agent invocation's model and tool calls are steps; a resumed run
replays recorded model responses and tool results and never re-runs a tool whose result was committed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("strands")

from strands import Agent, tool

import durable_sandbox
from durable_sandbox.engine import Engine, NonDeterminismError, RunStatus
from durable_sandbox.stores import SqliteStore
from durable_sandbox.workflows.agents import DurableAgentRun, current_run
from durable_sandbox.workflows.agents.core import decode, encode
from durable_sandbox.workflows.agents.scripted import ScriptedModel
from durable_sandbox.workflows.agents.strands import DurableModel, DurableStrandsAgent
from tests.unit.agent_support import coder_flow, read_log
from tests.unit.engine_support import Crash, ops
from tests.unit.lease_support import wait_for_lease_expiry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def eng(tmp_path: Path) -> Any:
    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="test-worker", lease_ttl=10.0)
    yield engine
    await engine.aclose()
    await store.close()


def effects(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in log if e["effect"] == kind]


# ---------------------------------------------------------------------- strands: the journal shape


async def test_model_and_tool_calls_are_steps_with_agent_scoped_ids(eng: Engine, tmp_path: Path) -> None:
    logfile = str(tmp_path / "effects.jsonl")
    st = await eng.run(coder_flow, {"log": logfile}, run_id="shape")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"final": "Done: two files written, tests pass.", "turns": 6}
    ids = [o.op_id for o in st.operations if o.op_id.startswith("coder/")]
    assert ids == [
        "coder/model/1",
        "coder/tool/1-write_file",
        "coder/tool/2-write_file",
        "coder/model/2",
        "coder/tool/3-run_tests",
        "coder/model/3",
    ]
    by_id = ops(st)
    assert all(by_id[i].kind == "step" and by_id[i].status == "completed" for i in ids)
    # the recorded tool result is the ToolResult the model saw
    assert by_id["coder/tool/3-run_tests"].result["content"] == [{"json": {"passed": 12, "failed": 0}}]
    # a model step records the stream events of the response
    assert {"messageStop": {"stopReason": "end_turn"}} in by_id["coder/model/3"].result
    log = read_log(logfile)
    assert len(effects(log, "model")) == 3 and len(effects(log, "write_file")) == 2


async def test_resume_after_completed_run_replays_nothing(eng: Engine, tmp_path: Path) -> None:
    logfile = str(tmp_path / "effects.jsonl")
    await eng.run(coder_flow, {"log": logfile}, run_id="done")
    before = read_log(logfile)
    st = await eng.resume("done")
    assert st.status == RunStatus.SUCCEEDED and read_log(logfile) == before


# ---------------------------------------------------------------------- crash in the middle of the loop


@durable_sandbox.workflow(name="tests.agent-crash")
async def crashy_flow(ctx: durable_sandbox.Context, params: dict[str, Any]) -> dict[str, Any]:
    logfile = params["log"]
    side: list[str] = []

    @tool
    def write_file(path: str, text: str) -> str:
        """Write a file."""
        side.append(path)
        with open(logfile, "a") as f:
            f.write(f'{{"effect": "write_file", "path": "{path}"}}\n')
        return f"wrote {path}"

    @tool
    def run_tests(target: str) -> str:
        """Run tests; the first time, the process 'dies' in the middle of it."""
        with open(logfile, "a") as f:
            f.write('{"effect": "run_tests"}\n')
        marker = Path(logfile + ".crashed")
        if not marker.exists():
            marker.write_text("1")
            raise Crash("worker died while the tests ran")
        return "12 passed"

    from tests.unit.agent_support import SCRIPT

    model = ScriptedModel(SCRIPT, on_call=lambda turn: open(logfile, "a").write(f'{{"effect": "model", "turn": {turn}}}\n'))
    agent = Agent(model=model, tools=[write_file, run_tests], callback_handler=None)
    result = await DurableStrandsAgent(agent).invoke(ctx, "coder", "Write a and b, then run the tests.")
    return {"final": str(result).strip()}


async def test_crash_mid_loop_replays_model_and_committed_tools(eng: Engine, tmp_path: Path) -> None:
    logfile = str(tmp_path / "effects.jsonl")
    with pytest.raises(Crash):
        await eng.run(crashy_flow, {"log": logfile}, run_id="crash")
    first = read_log(logfile)
    assert [e["effect"] for e in first] == ["model", "write_file", "write_file", "model", "run_tests"]
    st = await eng.inspect("crash")
    assert st.status == RunStatus.RUNNING  # as after a kill: nothing after the crash was recorded
    assert ops(st)["coder/tool/3-run_tests"].status == "started"
    assert "coder/model/3" not in ops(st)

    st = await eng.resume("crash")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"final": "Done: two files written, tests pass."}
    after = read_log(logfile)[len(first):]
    # model calls 1 and 2 and both write_file calls were replayed from the journal; only the tool that
    # had started without completing ran again, then the loop went on live.
    assert [e["effect"] for e in after] == ["run_tests", "model"]
    assert [e.get("turn") for e in effects(after, "model")] == [2]


async def test_sigkill_in_child_process_then_resume_elsewhere(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    logfile = str(tmp_path / "effects.jsonl")
    env = {**os.environ, "DURABLE_SANDBOX_FAULT": "after:coder/model/2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(  # noqa: ASYNC221 - the child must finish (be killed) before the test goes on
        [sys.executable, "-m", "tests.unit.agent_support", db, "killed", logfile],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    first = read_log(logfile)
    assert [e["effect"] for e in first] == ["model", "write_file", "write_file", "model"]

    await wait_for_lease_expiry(db, "killed")  # the child is dead; its lease must run out
    store = SqliteStore(db)
    engine = Engine(store, worker_id="second-worker")
    try:
        await engine.worker(idle_exit=True, poll_interval=0.05)
        st = await engine.inspect("killed")
    finally:
        await engine.aclose()
        await store.close()
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"final": "Done: two files written, tests pass.", "turns": 6}
    after = read_log(logfile)[len(first):]
    # model 1-2 and the write_file tools come from the journal; the run goes on with run_tests
    assert [e["effect"] for e in after] == ["run_tests", "model"]


# ---------------------------------------------------------------------- concurrency, determinism, errors


@durable_sandbox.workflow(name="tests.agent-concurrent")
async def concurrent_flow(ctx: durable_sandbox.Context, params: dict[str, Any]) -> list[str]:
    finished: list[str] = []
    fast_done = asyncio.Event()

    @tool
    async def slow(label: str) -> str:
        """Finishes only after the fast one: a fixed completion order, with no timing involved."""
        await fast_done.wait()
        finished.append(label)
        return label

    @tool
    async def fast(label: str) -> str:
        """Finishes at once."""
        finished.append(label)
        fast_done.set()
        return label

    script = [
        {"tool_calls": [{"name": "slow", "input": {"label": "s"}}, {"name": "fast", "input": {"label": "f"}}]},
        "ok",
    ]
    agent = Agent(model=ScriptedModel(script), tools=[slow, fast], callback_handler=None)
    await DurableStrandsAgent(agent).invoke(ctx, "a", "go")
    return finished


async def test_tool_numbers_follow_the_models_request_order_not_completion(eng: Engine) -> None:
    st = await eng.run(concurrent_flow, {}, run_id="conc")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == ["f", "s"]  # strands ran them concurrently
    assert "a/tool/1-slow" in ops(st) and "a/tool/2-fast" in ops(st)
    names = {o.op_id: o.name for o in st.operations}
    assert names["a/tool/1-slow"] == "agent-tool:slow", "the journal names what ran, for replay checks and humans"
    assert names["a/model/1"].startswith("agent-model:")


PROMPT = {"text": "Write a and b."}


@durable_sandbox.workflow(name="tests.agent-prompt")
async def prompt_flow(ctx: durable_sandbox.Context, params: dict[str, Any]) -> str:
    agent = Agent(model=ScriptedModel(["fine"]), callback_handler=None)
    result = await DurableStrandsAgent(agent).invoke(ctx, "bot", PROMPT["text"])
    await ctx.callback("ack")
    return str(result).strip()


async def test_replaying_a_different_conversation_is_nondeterminism(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    st = await eng.run(prompt_flow, {}, run_id="nd")
    assert st.status == RunStatus.WAITING
    monkeypatch.setitem(PROMPT, "text", "Something else entirely.")
    await eng.signal("nd", "ack", True)
    st = await eng.resume("nd")
    assert st.status == RunStatus.FAILED
    assert st.error is not None and st.error["type"] == NonDeterminismError.__name__
    assert "bot/model/1" in st.error["message"] and "inputDigest" in st.error["message"]


async def test_failed_tool_is_recorded_and_replayed_as_the_same_error_result(eng: Engine, tmp_path: Path) -> None:
    calls: list[str] = []

    @durable_sandbox.workflow(name="tests.agent-tool-error")
    async def flow(ctx: durable_sandbox.Context) -> Any:
        from strands.types.tools import AgentTool

        class Broken(AgentTool):
            tool_name = "broken"  # type: ignore[assignment]
            tool_type = "python"  # type: ignore[assignment]
            tool_spec = {"name": "broken", "description": "fails", "inputSchema": {"json": {"type": "object"}}}  # type: ignore[assignment]

            async def stream(self, tool_use: Any, invocation_state: Any, **kw: Any) -> Any:
                calls.append("broken")
                raise ValueError("disk full")
                yield  # pragma: no cover

        def answer(messages: list[Any]) -> Any:
            results = [b["toolResult"] for m in messages for b in m["content"] if "toolResult" in b]
            if not results:
                return {"tool_calls": [{"name": "broken", "input": {}}]}
            return "tool said: " + results[0]["content"][0]["text"]

        agent = Agent(model=ScriptedModel(answer), tools=[Broken()], callback_handler=None)
        result = await DurableStrandsAgent(agent).invoke(ctx, "x", "go")
        await ctx.callback("ack")
        return str(result).strip()

    st = await eng.run(flow, None, run_id="terr")
    assert st.status == RunStatus.WAITING
    assert ops(st)["x/tool/1-broken"].status == "failed"
    await eng.signal("terr", "ack", True)
    st = await eng.resume("terr")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert calls == ["broken"]  # not re-run on replay
    assert "disk full" in st.result


async def test_without_middleware_the_model_is_wrapped_for_the_invocation_only(eng: Engine) -> None:
    holder: dict[str, Any] = {}

    @durable_sandbox.workflow(name="tests.agent-no-mw")
    async def flow(ctx: durable_sandbox.Context) -> str:
        model = ScriptedModel(["hi"])
        agent = Agent(model=model, callback_handler=None)
        result = await DurableStrandsAgent(agent, use_middleware=False).invoke(ctx, "plain", "hello")
        holder["model_after"] = agent.model
        holder["model"] = model
        return str(result).strip()

    st = await eng.run(flow, None, run_id="nomw")
    assert st.status == RunStatus.SUCCEEDED and st.result == "hi"
    assert "plain/model/1" in ops(st)
    assert holder["model_after"] is holder["model"]


async def test_outside_a_durable_invocation_the_agent_runs_unjournaled() -> None:
    model = ScriptedModel(["plain answer"])
    agent = Agent(model=model, callback_handler=None)
    DurableStrandsAgent(agent)  # installs the hooks
    assert current_run() is None
    result = await agent.invoke_async("hi")
    assert str(result).strip() == "plain answer" and model.calls == 1
    assert not isinstance(agent.model, DurableModel)


# ---------------------------------------------------------------------- the framework-neutral core


@durable_sandbox.workflow(name="tests.agent-core-loop")
async def hand_loop(ctx: durable_sandbox.Context, params: dict[str, Any]) -> dict[str, Any]:
    """An agent loop without any framework: the 'model' is a function of the transcript."""
    logfile = params["log"]
    run = DurableAgentRun(ctx, "planner")
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3, then double it"}]

    def llm(history: list[dict[str, Any]]) -> dict[str, Any]:
        with open(logfile, "a") as f:
            f.write('{"effect": "model"}\n')
        tool_msgs = [m for m in history if m["role"] == "tool"]
        if not tool_msgs:
            return {"tool": "add", "args": [2, 3], "id": "c1"}
        if len(tool_msgs) == 1:
            return {"tool": "double", "args": [tool_msgs[0]["content"]], "id": "c2"}
        return {"answer": tool_msgs[-1]["content"], "raw": b"\x00\xff"}

    tools = {"add": lambda a, b: a + b, "double": lambda x: 2 * x}
    while True:
        reply = await run.model_call(lambda: llm(transcript), request=transcript)
        transcript.append({"role": "assistant", "content": reply})
        if "answer" in reply:
            return {"answer": reply["answer"], "raw_is_bytes": isinstance(reply["raw"], bytes)}
        name = reply["tool"]

        def call_tool(name: str = name, args: list[Any] = reply["args"]) -> Any:
            with open(logfile, "a") as f:
                f.write(f'{{"effect": "tool", "name": "{name}"}}\n')
            if params.get("crash_on") == name and not Path(logfile + ".crashed").exists():
                Path(logfile + ".crashed").write_text("1")
                raise Crash(name)
            return tools[name](*args)

        result = await run.tool_call(name, call_tool, call_id=reply["id"], input=reply["args"])
        transcript.append({"role": "tool", "content": result})


async def test_core_journals_a_hand_written_loop_and_resumes_it(eng: Engine, tmp_path: Path) -> None:
    logfile = str(tmp_path / "core.jsonl")
    with pytest.raises(Crash):
        await eng.run(hand_loop, {"log": logfile, "crash_on": "double"}, run_id="core")
    st = await eng.resume("core")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"answer": 10, "raw_is_bytes": True}
    assert [o.op_id for o in st.operations] == [
        "planner/model/1", "planner/tool/1-add", "planner/model/2", "planner/tool/2-double",
        "planner/model/3",
    ]
    assert ops(st)["planner/tool/2-double"].attempt == 1  # the interrupted attempt ran again under its id
    log = [e["effect"] + ":" + e.get("name", "") for e in read_log(logfile)]
    # first execution: model, add, model, double (crash); resume: double again, then the last model call
    assert log == ["model:", "tool:add", "model:", "tool:double", "tool:double", "model:"]


def test_encode_roundtrips_bytes_and_models() -> None:
    from pydantic import BaseModel

    class M(BaseModel):
        a: int

    value = {"b": b"\x01\x02", "t": (1, 2), "m": M(a=3), "n": None}
    assert decode(encode(value)) == {"b": b"\x01\x02", "t": [1, 2], "m": {"a": 3}, "n": None}
    with pytest.raises(TypeError):
        encode(object())


def test_agent_ids_are_validated() -> None:
    with pytest.raises(ValueError):
        DurableAgentRun(None, "/bad")  # type: ignore[arg-type]

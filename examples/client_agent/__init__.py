"""An agent that uses a durable Sandbox through the Python client (docs/agents.md), and survives what kills agents'
sandboxes: the operator killed mid-call, the sandbox lost.

    python -m examples.client_agent dev-box --namespace demo --url http://127.0.0.1:8443 --agent-id fix-add-1

It works the way a coding agent does, each step chosen from the last result (write a module and its test, run the
test, read the failure, fix the module, run again); no model is available offline, so the choice is a rule
(``next_step``), where a real agent puts its model. What makes it durable is only this: every call carries an
operation id made from the agent's id and the step's number. The client sends a call whose answer was lost
(the operator killed, a connection dropped) again with the same id until it is answered, and the Sandbox's journal
runs it once: a call the operator had finished is answered from the journal; one it was killed in is run again, in
a sandbox rebuilt without it. A sandbox lost between calls is restored from the newest snapshot and the later calls
replayed before the next one runs. The agent sees latency, never an error, and leaves the same workspace as an
undisturbed run. An agent restarted with the same ``--agent-id`` replays its finished steps from the journal.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.client import SandboxClient

__all__ = ["Transcript", "next_step", "run_agent"]

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\nassert add(2, 3) == 5, f'add(2, 3) gave {add(2, 3)}'\nprint('tests passed')\n"
MAX_STEPS = 10


@dataclass
class Transcript:
    steps: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)  # (tool, arguments, result)

    @property
    def last(self) -> str:
        return self.steps[-1][2] if self.steps else ""


def next_step(transcript: Transcript) -> tuple[str, dict[str, Any]] | None:
    """The next tool call from what happened so far (where a model would decide), or None when done."""
    done = [tool for tool, _, _ in transcript.steps]
    if not done:
        return "write_file", {"path": "calc.py", "contents": BUGGY}
    if len(done) == 1:
        return "write_file", {"path": "test_calc.py", "contents": TEST}
    if "tests passed" in transcript.last:
        return None
    if done[-1] == "shell" and "AssertionError" in transcript.last:
        return "read_file", {"path": "calc.py"}
    if done[-1] == "read_file" and "a - b" in transcript.last:
        return "write_file", {"path": "calc.py", "contents": FIXED}
    return "shell", {"command": "python3 -B test_calc.py"}  # -B: no bytecode cache left in the workspace


def run_agent(box: SandboxClient, agent_id: str,
              on_step: Callable[[int, str], None] | None = None) -> Transcript:
    """Run the agent's loop in the Sandbox ``box`` is attached to; step ``n``'s call is ``<agent_id>-<n>``.
    ``on_step(n, tool)`` is told of each step before its call is sent (a progress line; a test's hook)."""
    transcript = Transcript()
    for number in range(1, MAX_STEPS + 1):
        step = next_step(transcript)
        if step is None:
            return transcript
        tool, arguments = step
        if on_step is not None:
            on_step(number, tool)
        op = f"{agent_id}-{number}"
        if tool == "shell":
            result = box.run(arguments["command"], timeout=120, operation_id=op)
            text = result.stdout + result.stderr
        elif tool == "write_file":
            text = box.write_file(arguments["path"], arguments["contents"], operation_id=op).stdout
        else:
            text = box.read_file(arguments["path"], operation_id=op)
        transcript.steps.append((tool, arguments, text))
    raise RuntimeError(f"the agent did not finish in {MAX_STEPS} steps; last result: {transcript.last}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.client_agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("sandbox")
    parser.add_argument("--namespace")
    parser.add_argument("--url", help="the call API (default $DSB_SESSION_URL)")
    parser.add_argument("--agent-id", required=True, help="names the agent's calls: the same id replays them")
    args = parser.parse_args()
    with SandboxClient.attach(args.sandbox, namespace=args.namespace, url=args.url) as box:
        found = run_agent(box, args.agent_id, on_step=lambda n, tool: print(f"step {n}: {tool}", flush=True))
    for tool, arguments, text in found.steps:
        print(f"> {tool} {arguments}\n{text}\n")

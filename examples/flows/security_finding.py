"""Security finding remediation: a sandbox workspace holds the vulnerable code; a checkpointed coding
agent (strands-agents through the durable adapter, here with a scripted model) proposes a fix; the fix is
applied and tested in the sandbox; independent reviews run in parallel; approval is required only for
high-severity findings; a canary deploy is verified before the finding is closed.

    dsb run examples.flows.security_finding:remediate --input '{"id": "SEC-7", "severity": "high"}' --run-id sec-7
    dsb signal sec-7 approve-fix '{"approved": true, "by": "security-lead"}' && dsb resume sec-7

The agent's tools are pure (they read what the workflow gave them and return the proposal); the
workflow applies the patch with the sandbox session, whose calls are journaled by the session itself.
Sandbox calls inside agent tools are not supported: a session numbers its calls in execution order,
and a replayed tool step does not make them.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import BaseModel

import durable_sandbox
from examples.flows._effects import record

VULNERABLE = '''import sqlite3

def find_user(db, name):
    return db.execute("SELECT * FROM users WHERE name = '%s'" % name).fetchall()
'''

FIXED = '''import sqlite3

def find_user(db, name):
    return db.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchall()
'''

CHECK = '''import re, sys
src = open("app.py").read()
if re.search(r"execute\\([^)]*%", src):
    print("FAIL: SQL built with string formatting"); sys.exit(1)
print("OK: parameterized queries only")
'''


class Finding(BaseModel):
    id: str
    title: str = "SQL injection in find_user"
    severity: str = "medium"  # low | medium | high | critical
    file: str = "app.py"
    log: str | None = None


def coder_script(finding: Finding) -> list[Any]:
    """What the scripted model answers, turn by turn (a real model decides this itself)."""
    return [
        {"text": f"Looking at {finding.file}.", "tool_calls": [{"name": "inspect_code", "input": {"path": finding.file}}]},
        {"text": "The query is built with %; switching to a parameter.",
         "tool_calls": [{"name": "propose_patch", "input": {"path": finding.file, "contents": FIXED}}]},
        f"Proposed a parameterized query for {finding.id}.",
    ]


def build_coder(finding: Finding, workspace: dict[str, str]) -> Any:
    from strands import Agent, tool

    from durable_sandbox.workflows.agents.scripted import ScriptedModel

    @tool
    def inspect_code(path: str) -> str:
        """Return the contents of a workspace file."""
        record(finding.log, "agent:inspect_code", path=path)
        return workspace.get(path, f"no such file: {path}")

    @tool
    def propose_patch(path: str, contents: str) -> str:
        """Propose new contents for a file; the workflow applies and tests it."""
        record(finding.log, "agent:propose_patch", path=path)
        return f"patch for {path} recorded ({len(contents)} bytes)"

    model = ScriptedModel(coder_script(finding), on_call=lambda turn: record(finding.log, f"agent:model-{turn}"))
    return Agent(model=model, tools=[inspect_code, propose_patch], callback_handler=None,
                 system_prompt="You fix security findings with minimal patches.")


def proposed_patches(messages: list[Any]) -> dict[str, str]:
    """The patches the agent proposed, from its conversation (rebuilt identically on replay)."""
    out: dict[str, str] = {}
    for message in messages:
        for block in message.get("content", []):
            use = block.get("toolUse")
            if use and use.get("name") == "propose_patch":
                out[use["input"]["path"]] = use["input"]["contents"]
    return out


def security_review(patch: dict[str, str], log: str | None) -> dict[str, Any]:
    record(log, "review:security")
    ok = all("%" not in c.split("execute(", 1)[-1].split(")", 1)[0] for c in patch.values())
    return {"reviewer": "security", "approve": ok}


def code_review(patch: dict[str, str], log: str | None) -> dict[str, Any]:
    record(log, "review:code")
    return {"reviewer": "code", "approve": all(len(c.splitlines()) < 200 for c in patch.values())}


def test_review(exit_code: int, output: str, log: str | None) -> dict[str, Any]:
    record(log, "review:tests")
    return {"reviewer": "tests", "approve": exit_code == 0, "output": output.strip()}


def canary_deploy(finding_id: str, log: str | None) -> dict[str, Any]:
    record(log, "canary-deploy")
    return {"release": f"fix-{finding_id}", "traffic": 5}


def verify_canary(release: str, log: str | None) -> dict[str, Any]:
    record(log, "canary-verify")
    return {"release": release, "errorRate": 0.0, "healthy": True}


def promote(release: str, log: str | None) -> dict[str, Any]:
    record(log, "promote")
    return {"release": release, "traffic": 100}


def close_finding(finding_id: str, release: str, log: str | None) -> dict[str, Any]:
    record(log, "close")
    return {"finding": finding_id, "status": "closed", "fixedIn": release}


@durable_sandbox.workflow
async def remediate(ctx: durable_sandbox.Context, finding: Finding) -> dict[str, Any]:
    from durable_sandbox.workflows.agents.strands import DurableStrandsAgent

    log = finding.log
    async with ctx.sandbox("workspace", provider="local", snapshot_every=4) as sbx:
        await sbx.write_file(finding.file, VULNERABLE)
        await sbx.write_file("check.py", CHECK)
        before = await sbx.shell("python3 check.py")
        source = (await sbx.read_file(finding.file)).stdout

        agent = build_coder(finding, {finding.file: source})
        result = await DurableStrandsAgent(agent).invoke(
            ctx, "coder", f"Fix {finding.id} ({finding.title}, severity {finding.severity}) in {finding.file}."
        )
        patch = proposed_patches(agent.messages)
        if not patch:
            raise RuntimeError(f"The coding agent proposed no patch: {result}")
        for path, contents in patch.items():
            await sbx.write_file(path, contents)
        after = await sbx.shell("python3 check.py")

        reviews = await ctx.parallel("reviews", {
            "security": functools.partial(security_review, patch, log),
            "code": functools.partial(code_review, patch, log),
            "tests": functools.partial(test_review, after.exit_code, after.stdout, log),
        })
        if not all(r["approve"] for r in reviews.values()):
            return {"finding": finding.id, "status": "needs-work", "reviews": reviews}

        # Approval only for high severity. The run waits inside the sandbox block: the workspace stays
        # attached to the run (a long wait hibernates it: snapshot + destroy, restored on resume).
        approval: dict[str, Any] = {"approved": True, "by": "policy:auto"}
        if finding.severity in ("high", "critical"):
            approval = await ctx.callback("approve-fix", {"finding": finding.id, "severity": finding.severity,
                                                          "patch": sorted(patch), "reviews": json.dumps(reviews)})
            if not approval.get("approved"):
                return {"finding": finding.id, "status": "rejected", "by": approval.get("by")}

    canary = await ctx.step("canary-deploy", canary_deploy, finding.id, log)
    health = await ctx.step("canary-verify", verify_canary, canary["release"], log)
    if not health["healthy"]:
        return {"finding": finding.id, "status": "canary-failed", "canary": health}
    await ctx.step("promote", promote, canary["release"], log)
    closed = await ctx.step("close", close_finding, finding.id, canary["release"], log)
    return {
        **closed,
        "checkBefore": before.exit_code,
        "checkAfter": after.exit_code,
        "approvedBy": approval.get("by"),
        "agentSummary": str(result).strip(),
    }

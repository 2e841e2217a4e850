"""CI/CD for one change: design, implementation, review and tests run concurrently; a rework loop until
the checks pass; an approval callback; deploy; after a soak period (a durable sleep) an
integration-health verdict (a second callback) decides between done and rollback.

    dsb run examples.flows.cicd:cicd --input '{"change": "add /healthz"}' --run-id cicd-1
    dsb signal cicd-1 approve '{"approved": true, "by": "lead"}'   # may be sent before the run gets there
    dsb resume cicd-1
    dsb signal cicd-1 integration-health '{"healthy": true}' && dsb resume cicd-1

Every stage writes one line to ``input.log`` (when given), so a resumed run shows that completed
stages were not repeated.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

import durable_sandbox
from durable_sandbox import RetryPolicy
from examples.flows._effects import record


class CicdInput(BaseModel):
    change: str
    log: str | None = None
    failing_checks: int = 1  # how many rework rounds the checks need before they pass
    max_rework: int = 3
    soak_seconds: float = 0.1


def design(change: str, log: str | None) -> dict[str, Any]:
    record(log, "design")
    return {"doc": f"Design for {change}", "components": ["api", "handler"]}


def implement(change: str, log: str | None) -> dict[str, Any]:
    record(log, "implement")
    return {"commit": "c0ffee1", "files": ["api.py", "handler.py"]}


def review(change: str, log: str | None) -> dict[str, Any]:
    record(log, "review")
    return {"comments": [f"{change}: add a timeout"], "blocking": 1}


def write_tests(change: str, log: str | None) -> dict[str, Any]:
    record(log, "tests")
    return {"tests": ["test_api", "test_handler"]}


def run_checks(round_: int, failing: int, log: str | None) -> dict[str, Any]:
    record(log, f"checks-{round_}")
    passed = round_ >= failing
    return {"round": round_, "passed": passed, "failures": [] if passed else ["test_handler: timeout"]}


def rework(round_: int, failures: list[str], log: str | None) -> dict[str, Any]:
    record(log, f"rework-{round_}")
    return {"round": round_, "fixed": failures}


def deploy(commit: str, log: str | None) -> dict[str, Any]:
    record(log, "deploy", commit=commit)
    return {"release": f"rel-{commit}", "environment": "production"}


def rollback(release: str, log: str | None) -> dict[str, Any]:
    record(log, "rollback", release=release)
    return {"rolledBack": release}


@durable_sandbox.workflow  # registered as "examples.flows.cicd:cicd", so any worker can import it
async def cicd(ctx: durable_sandbox.Context, params: CicdInput) -> dict[str, Any]:
    log, change = params.log, params.change
    # Four tracks at once; each branch is its own step (`build/design`, ...), so a resumed run only redoes
    # what had not finished.
    tracks = await ctx.parallel("build", {
        "design": functools.partial(design, change, log),
        "implement": functools.partial(implement, change, log),
        "review": functools.partial(review, change, log),
        "tests": functools.partial(write_tests, change, log),
    })
    ctx.progress("built", percent=30)

    # Rework loop: explicit ids per round keep it deterministic.
    rounds = 0
    for round_ in range(params.max_rework + 1):
        checks = await ctx.step(f"checks-{round_}", run_checks, round_, params.failing_checks, log,
                                retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
        if checks["passed"]:
            break
        await ctx.step(f"rework-{round_}", rework, round_, checks["failures"], log)
        rounds += 1
    else:
        raise RuntimeError(f"checks still failing after {params.max_rework} rework rounds")
    ctx.progress("checks passed", percent=50)

    approval = await ctx.callback("approve", {"change": change, "commit": tracks["implement"]["commit"], "rework": rounds})
    if not approval.get("approved"):
        return {"status": "rejected", "by": approval.get("by")}

    release = await ctx.step("deploy", deploy, tracks["implement"]["commit"], log)
    ctx.progress("deployed", percent=80)

    await ctx.sleep("soak", params.soak_seconds)  # a durable timer: survives restarts
    health = await ctx.callback("integration-health", {"release": release["release"]})
    if not health.get("healthy"):
        undone = await ctx.step("rollback", rollback, release["release"], log)
        return {"status": "rolled-back", "release": release["release"], **undone}
    ctx.progress("verified", percent=100)
    return {"status": "released", "release": release["release"], "reworkRounds": rounds}

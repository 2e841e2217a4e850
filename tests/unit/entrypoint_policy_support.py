"""A module an operator may be allowed to import, which reaches a workflow of another module through an
attribute and holds a function that is not a workflow (tests/unit/test_trust_inputs.py)."""

from __future__ import annotations

from typing import Any

from tests.unit import cli_flows as elsewhere  # noqa: F401  (reached as `...:elsewhere.<workflow>`)


def not_a_workflow(ctx: Any, value: Any) -> Any:  # not async, not decorated: no workflow
    return value

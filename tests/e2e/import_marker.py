"""A workflow module whose import leaves a mark: the operator must never import a module it was not
configured with (importing runs the module's code with the operator's credentials)."""

from __future__ import annotations

import os
from pathlib import Path

import durable_sandbox

_marker = os.environ.get("DSB_IMPORT_MARKER")
if _marker:
    Path(_marker).write_text("imported\n")


@durable_sandbox.workflow
async def flow(ctx: durable_sandbox.Context, value: dict) -> dict:  # type: ignore[type-arg]
    return value

"""Side-effect log shared by the example flows: each stage appends one JSON line, so tests (and you)
can see which stages really ran and which a resumed run replayed from its journal."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def record(log: str | None, stage: str, **data: Any) -> None:
    if not log:
        return
    with open(log, "a") as f:
        f.write(json.dumps({"stage": stage, "pid": os.getpid(), **data}) + "\n")
        f.flush()


def read(log: str | Path) -> list[dict[str, Any]]:
    p = Path(log)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def stages(log: str | Path) -> list[str]:
    return [e["stage"] for e in read(log)]

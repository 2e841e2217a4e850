"""Where `dsb` keeps a run's env values: beside the store, never in it.

`spec.sandbox.env[].value` and a call's `env` may be secrets, so the run's stored input has them replaced
by ``***`` (``sandbox_agent.detach_env``). Until the run finishes, `dsb resume`, `dsb worker` and run
retries on this machine still need them for the provider: they live in ``<store>.env/``, a directory
only its owner can enter, one owner-only file per run, deleted by the first `dsb` command that finds the
run succeeded, cancelled or deleted (every command that opens the store checks when it closes it).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from durable_sandbox.engine import RunStatus, Store


class LocalEnvValues:
    """``AgentServices.env_values`` for runs `dsb run` starts: ``values = env_values(run_id)``."""

    def __init__(self, store_path: Path) -> None:
        self.directory = store_path.parent / f"{store_path.name}.env"

    def _path(self, run_id: str) -> Path:
        # Hashed: the file name never depends on what characters a run id may contain.
        return self.directory / (hashlib.sha256(run_id.encode()).hexdigest()[:32] + ".json")

    def save(self, run_id: str, values: Mapping[str, str]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        path = self._path(run_id)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"runId": run_id, "values": dict(values)}, out)
        os.replace(tmp, path)

    def __call__(self, run_id: str) -> dict[str, str] | None:
        try:
            data = json.loads(self._path(run_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        values = data.get("values") if isinstance(data, dict) and data.get("runId") == run_id else None
        return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else None

    async def forget_settled(self, store: Store) -> list[str]:
        """Delete the values of runs that will not execute again; returns their run ids."""
        if not self.directory.is_dir():
            return []
        forgotten = []
        for path in self.directory.glob("*.json"):
            try:
                run_id = json.loads(path.read_text(encoding="utf-8"))["runId"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            run = await store.get_run(run_id)
            if run is None or run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
                path.unlink(missing_ok=True)
                forgotten.append(run_id)
        return forgotten

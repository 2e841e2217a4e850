"""A sandbox's lease file (owner, labels, template, expiry, suspended; never env values) and its env file
(``spec.env``, mode 0600: it may hold secrets), written to a temp file and renamed into place."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.providers.contract import ProviderError, ProvisionError, SandboxSpec
from durable_sandbox.providers.local.arguments import ENV_NAME
from durable_sandbox.providers.local.layout import SANDBOX_ID, LocalLayout, temp_path


def lease_seconds_problem(seconds: object, maximum: int) -> str | None:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= maximum:
        return f"Lease of {seconds!r} seconds is invalid for the local provider: it must be in (0, {maximum}]"
    return None


def check_provision_args(spec: SandboxSpec, lease_seconds: int, maximum: int) -> None:
    problem = lease_seconds_problem(lease_seconds, maximum)
    if problem:
        raise ProvisionError(problem, retryable=False)
    for key, value in spec.env.items():
        if not ENV_NAME.fullmatch(key) or "\0" in value:
            # Name the variable, never the value: it may be a secret.
            raise ProvisionError(
                f"Invalid environment variable {key!r} in the sandbox spec", retryable=False
            )


class LeaseFiles:
    """The lease and env files of one provider's sandboxes."""

    def __init__(self, layout: LocalLayout, clock: Callable[[], float], env: dict[str, dict[str, str]]) -> None:
        self.layout = layout
        self.clock = clock
        # What this instance knows of each sandbox's env (env/<id>.json has it for the others).
        self.env = env

    def new(self, sandbox_id: str, spec: SandboxSpec, lease_seconds: float) -> dict[str, Any]:
        now = self.clock()
        return {
            "id": sandbox_id,
            "owner": spec.owner,
            "labels": dict(spec.labels),
            # Templates are an e2b notion; recorded so manifests written for e2b still run locally.
            "template": spec.template,
            "created_at": now,
            "expires_at": now + lease_seconds,
            "suspended": False,
        }

    def write(self, lease: dict[str, Any]) -> None:
        target = self.layout._lease_path(lease["id"])
        tmp = temp_path(self.layout.leases_dir, lease["id"])
        try:
            tmp.write_text(json.dumps(lease, sort_keys=True), encoding="utf-8")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def write_env(self, sandbox_id: str, env: Mapping[str, str]) -> None:
        """The sandbox's env, created readable by this user only (never widened by the umask)."""
        self.env[sandbox_id] = dict(env)
        target = self.layout._env_path(sandbox_id)
        tmp = temp_path(self.layout.env_dir, sandbox_id)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dict(env), f, sort_keys=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def sandbox_env(self, sandbox_id: str) -> dict[str, str]:
        known = self.env.get(sandbox_id)
        if known is not None:
            return known
        try:
            data = json.loads(self.layout._env_path(sandbox_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}  # made by a version that kept the env in memory only
        except (OSError, ValueError) as e:
            # Never the content in the message: it may be a secret.
            raise ProviderError(f"Cannot read the env of {sandbox_id}: {type(e).__name__}") from None
        env = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        self.env[sandbox_id] = env
        return env

    def read(self, sandbox_id: str) -> dict[str, Any] | None:
        if not SANDBOX_ID.fullmatch(sandbox_id):
            return None
        try:
            data = json.loads(self.layout._lease_path(sandbox_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ProviderError(f"Cannot read the lease of {sandbox_id}: {e}") from e
        return data if isinstance(data, dict) else None

    def all(self) -> list[dict[str, Any]]:
        leases = []
        for path in sorted(self.layout.leases_dir.glob("lsb-*.json")):
            with contextlib.suppress(ProviderError):
                lease = self.read(path.name[: -len(".json")])
                if lease is not None:
                    leases.append(lease)
        return leases

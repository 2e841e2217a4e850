"""The ``agent-sandbox`` provider's settings, from the operator's environment (the chart's
``providers.agentSandbox``): which SandboxWarmPool a claim names when the Workflow or Sandbox names none, where
the workspace is in the Pods of its templates, which container calls run in, and how long a claim may take to
become Ready."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from durable_sandbox.providers.contract import ConfigurationError

__all__ = ["ENV_CONTAINER", "ENV_READY_TIMEOUT", "ENV_WARM_POOL", "ENV_WORKSPACE", "AgentSandboxSettings"]

ENV_WARM_POOL = "DSB_AGENT_SANDBOX_WARM_POOL"
ENV_WORKSPACE = "DSB_AGENT_SANDBOX_WORKSPACE"
ENV_CONTAINER = "DSB_AGENT_SANDBOX_CONTAINER"
ENV_READY_TIMEOUT = "DSB_AGENT_SANDBOX_READY_TIMEOUT"
_ENV_FIELDS: Final[Mapping[str, str]] = {ENV_WARM_POOL: "warm_pool", ENV_WORKSPACE: "workspace",
                                  ENV_CONTAINER: "container", ENV_READY_TIMEOUT: "ready_timeout"}
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class AgentSandboxSettings(BaseModel):
    """Each field is read from the environment variable named beside it (empty or unset: the default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    warm_pool: str | None = None  # DSB_AGENT_SANDBOX_WARM_POOL: a SandboxWarmPool in the sandbox's namespace
    workspace: str = "/workspace"  # DSB_AGENT_SANDBOX_WORKSPACE: made if missing; snapshots hold only it
    container: str | None = None  # DSB_AGENT_SANDBOX_CONTAINER: default the Pod's first container
    ready_timeout: float = Field(default=120.0, gt=0)  # DSB_AGENT_SANDBOX_READY_TIMEOUT: seconds to Ready

    @field_validator("warm_pool")
    @classmethod
    def _pool_name(cls, value: str | None) -> str | None:
        return warm_pool_name(value) if value is not None else None

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") == "" or "\0" in value:
            raise ValueError(f"must be an absolute directory path other than /, got {value!r}")
        return value.rstrip("/")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Self:
        """The settings ``environ`` gives; :class:`ConfigurationError` naming the variable that is wrong."""
        values = {field: environ[key] for key, field in _ENV_FIELDS.items() if environ.get(key)}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            names = {field: key for key, field in _ENV_FIELDS.items()}
            problems = "; ".join(f"{names.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}" for e in exc.errors())
            raise ConfigurationError(f"Sandbox provider [agent-sandbox] is misconfigured: {problems}") from None


def warm_pool_name(value: str) -> str:
    """``value`` if it can be a SandboxWarmPool's name (a DNS subdomain), else ValueError saying so."""
    if not _DNS_NAME.match(value):
        raise ValueError(f"{value!r} is not a SandboxWarmPool name (lower-case letters, digits, '-' and '.')")
    return value

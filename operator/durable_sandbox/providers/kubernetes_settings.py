"""How the kubernetes provider reads a JSON setting of the operator's (``DSB_K8S_TEMPLATE``, ``DSB_K8S_POLICY``)
into a frozen pydantic model, and says what is wrong with one that does not parse."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from durable_sandbox.providers.contract import ConfigurationError

__all__ = ["SettingModel", "describe_errors", "from_environ"]


class SettingModel(BaseModel):
    """A setting's model: camelCase aliases as in a Pod spec, unknown keys refused (a typo is not ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


_M = TypeVar("_M", bound=SettingModel)


def from_environ(model: type[_M], key: str, what: str, environ: Mapping[str, str] | None) -> _M:
    """The operator's JSON setting ``key`` as ``model`` (its defaults when unset)."""
    raw = (os.environ if environ is None else environ).get(key)
    if not raw:
        return model()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise ConfigurationError(f"Sandbox provider [kubernetes]: {key} is not a valid {what}: "
                                 f"{describe_errors(exc)}") from None


def describe_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'template'}: {e['msg']}"
                     for e in exc.errors(include_input=False))

"""Secret values named by ``env[].valueFrom.secretKeyRef``, read in the resource's namespace.

Shared by Workflows (``spec.sandbox.env``) and Sandboxes (``spec.env``): values stay in the operator's
memory and go only into the sandbox; errors name the Secret and key, never a value.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from durable_sandbox.kube.api.client import is_not_found


class SecretNotReadable(LookupError):
    """The operator is not allowed to read a Secret the spec names (RBAC): a person must allow it or change it."""


def secret_refs(env: Iterable[Any]) -> set[tuple[str, str]]:
    """``(secret name, key)`` of every ``valueFrom.secretKeyRef`` in an env list (dicts or EnvVar models)."""
    refs: set[tuple[str, str]] = set()
    for var in env:
        if isinstance(var, dict):
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
        elif getattr(var, "value_from", None) is not None:
            ref_ = var.value_from.secret_key_ref
            refs.add((ref_.name, ref_.key))
    return refs


async def read_secret_values(
    core: Any, namespace: str, refs: Iterable[tuple[str, str]], *, where: str
) -> dict[tuple[str, str], str]:
    """The values of ``refs``; ``LookupError`` (naming ``where``, the Secret and the key) when one is missing."""
    values: dict[tuple[str, str], str] = {}
    for name, key in sorted(set(refs)):
        try:
            secret = await core.read_namespaced_secret(name, namespace)
        except Exception as exc:
            if is_not_found(exc):
                raise LookupError(f"{where}: Secret {namespace}/{name} does not exist; create it (the operator retries)") from None
            if getattr(exc, "status", None) == 403:
                raise SecretNotReadable(
                    f"{where}: the operator may not read Secret {namespace}/{name}: only the Secrets the operator's "
                    f"installation allows (the chart's workflowSecrets, in workflowSecretNamespaces) can reach a "
                    f"sandbox; use one of those, or ask the operator's administrator to allow this one (the "
                    f"operator retries)"
                ) from None
            raise
        data = secret.data or {}
        if key not in data:
            raise LookupError(f"{where}: Secret {namespace}/{name} has no key {key!r}")
        values[(name, key)] = base64.b64decode(data[key]).decode()
    return values

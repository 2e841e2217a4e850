"""Whether a Pod is the Pod a manifest describes, in every field that decides what runs there and with which
rights: what a claim, a promotion or an adoption checks before it trusts a Pod it finds (a seal says *who* made
a Pod; this says that it is still *what* was made).

Pure: a Pod (as the API server answers it) and a manifest (``PodTemplate.pod``) in, the first difference out.
The API server fills in defaults the manifest does not set (``serviceAccountName: default``, a volume's
``defaultMode``, ``false`` host namespaces left out); those are read as the manifest's own value, nothing else
is: a field the manifest leaves empty must be empty in the Pod too (a ``privileged: true`` added to an empty
``securityContext`` is a difference, not a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["spec_mismatch"]

# Pod spec fields compared as a whole (absent, None, {} and [] are the same: nothing).
_POD_FIELDS = ("runtimeClassName", "securityContext", "automountServiceAccountToken", "initContainers", "activeDeadlineSeconds",
               "ephemeralContainers", "shareProcessNamespace", "hostUsers")
_HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")  # absent is false
_CONTAINER_FIELDS = ("name", "image", "command", "args", "securityContext")
# What the API server adds to a volume the manifest names: (source field, default value).
_VOLUME_DEFAULTS: Final[Mapping[str, Any]] = {"defaultMode": 420, "type": ""}


def _nothing(value: Any) -> bool:
    return value is None or value == {} or value == []


def _same(got: Any, want: Any) -> bool:
    return (_nothing(got) and _nothing(want)) or got == want


def _volume(volume: Mapping[str, Any]) -> dict[str, Any]:
    """A volume with the API server's defaults of its source taken out."""
    out: dict[str, Any] = {}
    for key, source in volume.items():
        if isinstance(source, Mapping):
            source = {k: v for k, v in source.items() if _VOLUME_DEFAULTS.get(k, object()) != v}
        out[key] = source
    return out


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(spec.get("containers") or [])


def spec_mismatch(pod: Mapping[str, Any], manifest: Mapping[str, Any]) -> str | None:
    """What of ``pod``'s spec differs from ``manifest``'s in the fields that matter (image, command, args,
    runtime class, pod and container security contexts, volumes, service account and its token, host
    namespaces, init and ephemeral containers); None when nothing does."""
    spec, want = pod.get("spec") or {}, manifest.get("spec") or {}
    got_containers, want_containers = _containers(spec), _containers(want)
    if len(got_containers) != len(want_containers):
        return f"it has {len(got_containers)} containers, the template {len(want_containers)}"
    for got, expected in zip(got_containers, want_containers, strict=True):
        for key in _CONTAINER_FIELDS:
            if not _same(got.get(key), expected.get(key)):
                return f"its container's {key} is {got.get(key)!r}, the template's {expected.get(key)!r}"
    for key in _POD_FIELDS:
        if not _same(spec.get(key), want.get(key)):
            return f"its {key} is {spec.get(key)!r}, the template's {want.get(key)!r}"
    for key in _HOST_NAMESPACES:
        if bool(spec.get(key)) != bool(want.get(key)):
            return f"its {key} is {bool(spec.get(key))}, the template's {bool(want.get(key))}"
    account = spec.get("serviceAccountName") or "default"
    if account != (want.get("serviceAccountName") or "default"):
        return f"its serviceAccountName is {account!r}, the template's {want.get('serviceAccountName') or 'default'!r}"
    got_volumes = [_volume(v) for v in spec.get("volumes") or []]
    want_volumes = [_volume(v) for v in want.get("volumes") or []]
    if got_volumes != want_volumes:
        return f"its volumes are {[v.get('name') for v in got_volumes]} (or their sources differ), the template's " \
               f"{[v.get('name') for v in want_volumes]}"
    return None

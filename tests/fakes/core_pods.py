"""A fake of the Pods, Secrets, PodTemplates and Events of ``kubernetes.aio``'s CoreV1Api, as the kubernetes
provider calls them (the ``*_without_preload_content`` calls, answering JSON bodies), and of its exec.

What the API server does that the trust rules lean on is done here too: every object gets a fresh ``uid`` and
``resourceVersion``; a merge patch carrying a ``resourceVersion`` is conditional (409 when it differs); a delete
with ``preconditions.uid`` is refused (409) for another uid; deleting a Pod deletes the Secrets it owns (the
garbage collector, at once); a create of an existing name is 409. Pods run at once (``running=False`` leaves
them pending until a watch of the Pod, which starts it: the kubelet's part). Tests plant and edit objects directly in ``pods`` / ``secrets`` (as a namespace user would
through the API) and read ``events`` and ``deleted`` afterwards.
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from durable_sandbox.providers.kubernetes_exec import ExecOutcome

Key = tuple[str, str]  # namespace, name


@dataclass
class FakeResponse:
    status: int
    body: bytes
    reason: str = "OK"

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        return None


class FakeWatch:
    """A watch's streaming answer: one JSON event a line, then the end (the API server's timeout)."""

    status, reason = 200, "OK"

    def __init__(self, events: Sequence[Mapping[str, Any]]) -> None:
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]
        self.closed = False
        self.content = self

    async def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""

    def close(self) -> None:
        self.closed = True


def _answer(obj: Any, status: int = 200) -> FakeResponse:
    return FakeResponse(status, json.dumps(obj).encode())


def _refusal(status: int, message: str) -> FakeResponse:
    return FakeResponse(status, json.dumps({"kind": "Status", "code": status, "message": message}).encode(),
                        reason=message)


async def _now(response: FakeResponse) -> FakeResponse:
    return response


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _selected(labels: Mapping[str, str], selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeCore:
    def __init__(self, *, running: bool = True) -> None:
        self.running = running
        self.pods: dict[Key, dict[str, Any]] = {}
        self.secrets: dict[Key, dict[str, Any]] = {}
        self.templates: dict[Key, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, str]] = []  # (kind, namespace/name, uid) of every deletion
        self.watches: list[tuple[str, str, dict[str, Any]]] = []  # (namespace, field selector, options) of each watch
        self._versions = itertools.count(100)

    # ---------------------------------------------------------------- what a test does (as a namespace user)

    def stamp(self, obj: dict[str, Any], *, uid: str | None = None) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta["uid"] = uid or str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta.setdefault("creationTimestamp", "2026-12-07T00:00:00Z")
        meta.setdefault("labels", {})
        meta.setdefault("annotations", {})
        return obj

    def put_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create ``pod`` as a user would (a new uid), running unless the fake says otherwise."""
        body = self.stamp(copy.deepcopy(pod))
        if self.running:
            body["status"] = {"phase": "Running", "containerStatuses": [{"ready": True, "state": {"running": {}}}]}
        self.pods[(body["metadata"]["namespace"], body["metadata"]["name"])] = body
        return body

    # The trust kit's Cluster (tests/unit/trust_support.py): what a namespace user does, straight to the store.

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("kind") == "Secret":
            secret = self.stamp(copy.deepcopy(body))
            self.secrets[(secret["metadata"]["namespace"], secret["metadata"]["name"])] = secret
            return secret
        return self.put_pod(body)

    def delete(self, namespace: str, name: str) -> None:
        answer = self._delete(self.pods, "Pod", namespace, name, {})
        assert answer.status == 200, answer

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        answer = self._patch(self.pods, namespace, name, patch)
        assert answer.status == 200, answer
        return dict(json.loads(answer.body))

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.secrets.get((namespace, name))

    def delete_secret(self, namespace: str, name: str) -> None:
        self.secrets.pop((namespace, name), None)

    def warnings(self, namespace: str, name: str) -> list[str]:
        return [e["message"] for e in self.events if e["type"] == "Warning"
                and e["involvedObject"]["namespace"] == namespace and e["involvedObject"]["name"] == name]

    # ---------------------------------------------------------------- Pods

    def read_namespaced_pod_without_preload_content(self, name: str, namespace: str) -> Any:
        found = self.pods.get((namespace, name))
        return _now(_answer(found) if found else _refusal(404, f'pods "{name}" not found'))

    def list_namespaced_pod_without_preload_content(self, namespace: str, label_selector: str | None = None,
                                                    watch: bool = False, field_selector: str | None = None,
                                                    **options: Any) -> Any:
        if watch:
            return _now(self._watch(namespace, field_selector or "", options))
        items = [p for (ns, _), p in self.pods.items()
                 if ns == namespace and _selected(p["metadata"].get("labels") or {}, label_selector)]
        return _now(_answer({"items": copy.deepcopy(items)}))

    def _watch(self, namespace: str, field_selector: str, options: Mapping[str, Any]) -> FakeWatch:
        """A watch of one Pod by name: the kubelet starts it now (a pending Pod runs), and the watch shows that
        as one MODIFIED event (a Pod already running shows nothing new: the watch ends quietly)."""
        self.watches.append((namespace, field_selector, dict(options)))
        name = field_selector.removeprefix("metadata.name=")
        pod = self.pods.get((namespace, name))
        if pod is None or "running" in str(pod.get("status")):
            return FakeWatch([])
        pod["status"] = {"phase": "Running", "containerStatuses": [{"ready": True, "state": {"running": {}}}]}
        pod["metadata"]["resourceVersion"] = str(next(self._versions))
        return FakeWatch([{"type": "MODIFIED", "object": copy.deepcopy(pod)}])

    def create_namespaced_pod_without_preload_content(self, namespace: str, body: Mapping[str, Any]) -> Any:
        name = body["metadata"]["name"]
        if (namespace, name) in self.pods:
            return _now(_refusal(409, f'pods "{name}" already exists'))
        return _now(_answer(self.put_pod(dict(body)), 201))

    def patch_namespaced_pod_without_preload_content(self, name: str, namespace: str, body: Mapping[str, Any]) -> Any:
        return _now(self._patch(self.pods, namespace, name, body))

    def delete_namespaced_pod_without_preload_content(self, name: str, namespace: str, **options: Any) -> Any:
        answer = self._delete(self.pods, "Pod", namespace, name, options)
        if answer.status == 200:
            uid = json.loads(answer.body)["metadata"]["uid"]
            for (ns, secret), obj in list(self.secrets.items()):  # the garbage collector: owned Secrets go too
                if ns == namespace and any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or []):
                    self.secrets.pop((ns, secret))
                    self.deleted.append(("Secret", f"{ns}/{secret}", obj["metadata"]["uid"]))
        return _now(answer)

    # ---------------------------------------------------------------- Secrets, PodTemplates, Events

    def read_namespaced_secret_without_preload_content(self, name: str, namespace: str) -> Any:
        found = self.secrets.get((namespace, name))
        return _now(_answer(found) if found else _refusal(404, f'secrets "{name}" not found'))

    def create_namespaced_secret_without_preload_content(self, namespace: str, body: Mapping[str, Any]) -> Any:
        name = body["metadata"]["name"]
        if (namespace, name) in self.secrets:
            return _now(_refusal(409, f'secrets "{name}" already exists'))
        secret = self.stamp(copy.deepcopy(dict(body)))
        self.secrets[(namespace, name)] = secret
        return _now(_answer(secret, 201))

    def patch_namespaced_secret_without_preload_content(self, name: str, namespace: str,
                                                        body: Mapping[str, Any]) -> Any:
        return _now(self._patch(self.secrets, namespace, name, body))

    def delete_namespaced_secret_without_preload_content(self, name: str, namespace: str, **options: Any) -> Any:
        return _now(self._delete(self.secrets, "Secret", namespace, name, options))

    def read_namespaced_pod_template_without_preload_content(self, name: str, namespace: str) -> Any:
        found = self.templates.get((namespace, name))
        return _now(_answer(found) if found else _refusal(404, f'podtemplates "{name}" not found'))

    def create_namespaced_event_without_preload_content(self, namespace: str, body: Mapping[str, Any]) -> Any:
        self.events.append(copy.deepcopy(dict(body)))
        return _now(_answer(body, 201))

    # ---------------------------------------------------------------- shared

    def _patch(self, store: dict[Key, dict[str, Any]], namespace: str, name: str,
               body: Mapping[str, Any]) -> FakeResponse:
        found = store.get((namespace, name))
        if found is None:
            return _refusal(404, f'"{name}" not found')
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != found["metadata"]["resourceVersion"]:
            return _refusal(409, "the object has been modified")
        patch = copy.deepcopy(dict(body))
        patch.get("metadata", {}).pop("resourceVersion", None)
        _merge(found, patch)
        found["metadata"]["resourceVersion"] = str(next(self._versions))
        return _answer(found)

    def _delete(self, store: dict[Key, dict[str, Any]], kind: str, namespace: str, name: str,
                options: Mapping[str, Any]) -> FakeResponse:
        found = store.get((namespace, name))
        if found is None:
            return _refusal(404, f'"{name}" not found')
        wanted = ((options.get("body") or {}).get("preconditions") or {}).get("uid")
        if wanted is not None and wanted != found["metadata"]["uid"]:
            return _refusal(409, f"Precondition failed: UID in precondition: {wanted}, UID in object meta: "
                                 f"{found['metadata']['uid']}")
        store.pop((namespace, name))
        self.deleted.append((kind, f"{namespace}/{name}", found["metadata"]["uid"]))
        return _answer(found)


class FakeExec:
    """Every exec answers ``exit_code`` (the image probe passes); ``runs`` keeps (namespace, pod) of each and
    ``sent`` what its stdin carried; ``during`` (if set) is called while an exec runs (a Pod replaced meanwhile)."""

    def __init__(self, exit_code: int = 0) -> None:
        self.exit_code = exit_code
        self.runs: list[tuple[str, str]] = []
        self.sent: list[bytes] = []
        self.during: Callable[[str, str], None] | None = None

    async def run(self, namespace: str, pod: str, container: str, command: Sequence[str], *,
                  stdout: Callable[[bytes], Any], stderr: Callable[[bytes], Any],
                  stdin: AsyncIterator[bytes] | None = None, what: str = "exec") -> ExecOutcome:
        self.runs.append((namespace, pod))
        received = b""
        if stdin is not None:
            async for chunk in stdin:
                received += chunk
        self.sent.append(received)
        if self.during is not None:
            self.during(namespace, pod)
        return ExecOutcome(exit_code=self.exit_code, status={"status": "Success"})

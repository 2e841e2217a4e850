"""The trust kit: what a namespace user (who may create, patch and delete Pods and Secrets, and no more) does to
a component that lists or watches sandbox Pods, and what the component must never do about it (issue 32).

Like the provider and store contract kits (``providers/testing.py``, ``stores/testing.py``): subclass
:class:`TrustKit`, give it a ``world`` fixture (:class:`Attack`: the component and the cluster it sees) and it
runs four forgeries against it, each made from a *genuine* object the component made itself:

* **planted**: a new Pod (another name, a hostile spec) carrying the genuine Pod's labels and annotations, seal
  included, as printed on the genuine one;
* **relabelled**: a Pod of the user's own given the labels of the genuine Pod's owner and operation;
* **re-created**: the genuine Pod deleted and made again under the same name, metadata copied, spec hostile;
* **annotation-edited**: the genuine Pod itself with its description annotation (owner, labels) rewritten
  to name another owner, so a listing by owner or installation would take it for another's.

After the component's action (:meth:`Attack.act`), a forged Pod must not be among what it used (adopted,
claimed, promoted, listed), must still exist (not deleted, nor the Secret ``<pod>-env`` the user made beside
it), and where the component met it, a Warning Event on it must say so. Each world also shows that the
component still does its job with the genuine object (a positive control: the kit cannot pass by doing nothing).

The cluster is a :class:`Cluster`: the fake core API in the unit tier (``tests/fakes/core_pods.py``); a real
API server's through kubectl in the node tier.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import pytest

HOSTILE_SPEC: dict[str, Any] = {
    "hostNetwork": True, "automountServiceAccountToken": False, "restartPolicy": "Never",
    "containers": [{"name": "sandbox", "image": "localhost/planted:evil", "command": ["sleep", "3600"]}],
}
FORGERIES = ("planted", "relabelled", "recreated", "annotation_edited")
DESCRIPTION = "durable-sandbox.dev/sandbox"


class Cluster(Protocol):
    """What a namespace user can do to Pods and Secrets, and where Events are read."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create(self, body: dict[str, Any]) -> dict[str, Any]: ...  # a Pod or a Secret (by its kind)
    def delete(self, namespace: str, name: str) -> None: ...  # a Pod, at once
    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...
    def secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def delete_secret(self, namespace: str, name: str) -> None: ...  # (none there: nothing to do)
    def warnings(self, namespace: str, name: str) -> list[str]: ...  # messages of Warning Events about a Pod


@dataclass
class Attack:
    """One component under attack. ``genuine``: a Pod it made (what forgeries copy); ``act``: its action, which
    answers the uids of the Pods it used; ``meets``: the forgeries its action looks at (so must report)."""

    cluster: Cluster
    genuine: dict[str, Any]
    act: Callable[[], Awaitable[set[str]]]
    meets: frozenset[str] = frozenset(FORGERIES)
    genuine_used: bool = True  # the positive control: does the action use the genuine Pod (else: delete it)?
    notes: dict[str, Any] = field(default_factory=dict)  # "edit": this world's annotation edit (a merge patch)
    hostile: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(HOSTILE_SPEC))  # the forgeries' spec


def _meta(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["metadata"]


def forge(kind: str, attack: Attack) -> dict[str, Any]:
    """Make forgery ``kind`` of ``attack.genuine`` in the cluster (and a Secret ``<pod>-env`` of the user's
    beside it); the forged Pod as the cluster holds it."""
    cluster, genuine = attack.cluster, attack.genuine
    namespace, name = _meta(genuine)["namespace"], _meta(genuine)["name"]
    labels = dict(_meta(genuine).get("labels") or {})
    annotations = dict(_meta(genuine).get("annotations") or {})
    if kind == "planted":
        forged = _pod(attack, f"{name}-planted", labels, annotations)
    elif kind == "relabelled":
        mine = cluster.create(_pod(attack, f"{name}-mine", {"app": "mine"}, {}))
        forged = cluster.patch(namespace, _meta(mine)["name"], {"metadata": {"labels": labels,
                                                                             "annotations": annotations}})
        _user_secret(cluster, namespace, _meta(forged)["name"])
        return forged
    elif kind == "recreated":
        return recreate(cluster, genuine, attack.hostile)
    elif kind == "annotation_edited":
        described = dict(_described(annotations))
        described["owner"] = f"{namespace}/someone-else"
        edit = attack.notes.get("edit") or {"metadata": {"annotations": {DESCRIPTION: _dump(described)}}}
        return cluster.patch(namespace, name, edit)
    else:
        raise AssertionError(kind)
    created = cluster.create(forged)
    _user_secret(cluster, namespace, _meta(created)["name"])
    return created


def recreate(cluster: Cluster, genuine: dict[str, Any], hostile: dict[str, Any] | None = None) -> dict[str, Any]:
    """The re-created forgery: ``genuine`` deleted and a Pod of the user's made under its name, its labels and
    annotations (seal included) copied, its spec ``hostile``; and the user's Secret ``<pod>-env`` beside it.
    The forged Pod as the cluster holds it (another uid)."""
    namespace, name = _meta(genuine)["namespace"], _meta(genuine)["name"]
    cluster.delete(namespace, name)
    # (A Secret of the old name-only scheme goes with the Pod it belonged to: the user's is made once it is gone.)
    cluster.delete_secret(namespace, f"{name}-env")
    created = cluster.create({"apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(hostile or HOSTILE_SPEC),
                              "metadata": {"namespace": namespace, "name": name,
                                           "labels": dict(_meta(genuine).get("labels") or {}),
                                           "annotations": dict(_meta(genuine).get("annotations") or {})}})
    _user_secret(cluster, namespace, name)
    return created


def _pod(attack: Attack, name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    namespace = _meta(attack.genuine)["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(attack.hostile),
            "metadata": {"namespace": namespace, "name": name, "labels": labels, "annotations": annotations}}


def _user_secret(cluster: Cluster, namespace: str, pod: str) -> None:
    if cluster.secret(namespace, f"{pod}-env") is None:
        cluster.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "stringData": {"MINE": "1"},
                        "metadata": {"namespace": namespace, "name": f"{pod}-env"}})


def _described(annotations: dict[str, str]) -> dict[str, Any]:
    import json

    return dict(json.loads(annotations.get(DESCRIPTION) or "{}"))


def _dump(value: dict[str, Any]) -> str:
    import json

    return json.dumps(value, sort_keys=True)


class TrustKit:
    """Subclass with a ``world`` fixture answering an :class:`Attack`; every forgery is tried against it."""

    forgeries: ClassVar[tuple[str, ...]] = FORGERIES

    @pytest.fixture
    def world(self) -> Attack:
        raise NotImplementedError("a TrustKit subclass provides the world under attack")

    async def test_the_component_does_its_job_with_what_it_made(self, world: Attack) -> None:
        """The positive control: without forgeries the component uses (or deletes) its own Pod."""
        used = await world.act()
        uid = _meta(world.genuine)["uid"]
        if world.genuine_used:
            assert uid in used, "the component did not use the Pod it made itself: the kit would prove nothing"
        else:
            left = world.cluster.get(_meta(world.genuine)["namespace"], _meta(world.genuine)["name"])
            assert left is None or _meta(left).get("deletionTimestamp"), \
                "the component did not delete the Pod it made itself: the kit would prove nothing"

    @pytest.mark.parametrize("kind", FORGERIES)
    async def test_a_forged_pod_is_never_used_nor_deleted_and_the_refusal_is_seen(self, world: Attack,
                                                                                  kind: str) -> None:
        if kind not in self.forgeries:
            pytest.skip(f"{type(self).__name__} has no {kind} case")  # (none does today: every kit runs all four)
        forged = forge(kind, world)
        namespace, name, uid = _meta(forged)["namespace"], _meta(forged)["name"], _meta(forged)["uid"]
        used = await world.act()
        assert uid not in used, f"the {kind} Pod {name} was used (adopted, claimed, promoted or listed)"
        still = world.cluster.get(namespace, name)
        assert still is not None and _meta(still)["uid"] == uid and not _meta(still).get("deletionTimestamp"), \
            f"the {kind} Pod {name} was deleted"
        if kind != "annotation_edited":  # (the genuine Pod's own env Secret is the operator's: not the point)
            assert world.cluster.secret(namespace, f"{name}-env") is not None, \
                f"the user's Secret {name}-env beside the {kind} Pod was deleted"
        if kind in world.meets:
            assert world.cluster.warnings(namespace, name), f"the refusal of the {kind} Pod {name} was not said " \
                                                            f"in a Warning Event on it"

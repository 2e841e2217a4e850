"""The journal's trust boundary, on the real control plane (issue 20, item 1).

The journal lives in objects of the operator's own kind (``Journal``), which the namespace roles ``edit`` and
``admin`` do not grant, unlike ConfigMaps; and every value the operator acts on is sealed with a key only it
holds, so an edit by anyone with broader rights (a cluster administrator here) is detected and refused,
never replayed."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator

import pytest

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.engine.records import Commit, OperationRecord, RunRecord
from durable_sandbox.kube.store import KubernetesStore
from tests.e2e.controlplane import ControlPlane
from tests.e2e.store_support import TEST_JOURNAL_KEY, ManualMonotonic, drop_namespace, namespace_with_crds

pytestmark = pytest.mark.apiserver_journal(
    "Journal objects' RBAC and the journal key's seal; in PostgreSQL who may write the tables is the database's "
    "access control, out of every namespace user's reach (docs/operations.md)"
)


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = namespace_with_crds(control_plane, "jtrust")
    yield name
    drop_namespace(control_plane, name)


@pytest.fixture
async def store(namespace: str) -> AsyncIterator[KubernetesStore]:
    s = await KubernetesStore.connect(namespace, clock=ManualMonotonic(), journal_key=TEST_JOURNAL_KEY)
    yield s
    await s.close()


async def _fresh(namespace: str, key: bytes | None = TEST_JOURNAL_KEY) -> KubernetesStore:
    """Another replica's view of the namespace: nothing cached, so everything is read (and checked) anew."""
    return await KubernetesStore.connect(namespace, journal_key=key)


def _call(op_id: str, command: str, stdout: str) -> list[OperationRecord]:
    return [
        OperationRecord(op_id, "sandbox.call", "shell", "started", 1, "d", meta={"args": {"command": command}}),
        OperationRecord(op_id, "sandbox.call", "shell", "completed", 1, "d",
                        {"exitCode": 0, "stdout": stdout, "stderr": ""}),
    ]


async def _run_with_calls(store: KubernetesStore, run_id: str, input_: dict[str, object]) -> None:
    run, _ = await store.create_run(RunRecord(run_id=run_id, workflow="sandbox-agent", input=input_))
    lease = await store.claim(run.run_id, "w", 300)
    await store.commit(run.run_id, lease.fence, Commit(_call("ws/c1", "echo one", "one\n")))
    await store.commit(run.run_id, lease.fence, Commit(_call("ws/c2", "echo two", "two\n")))
    await store.put_signal(run.run_id, "approve", {"ok": True})


def _journal(control_plane: ControlPlane, namespace: str, name: str) -> dict[str, str]:
    data: dict[str, str] = control_plane.kubectl_json("get", "journal", name, "-n", namespace)["data"]
    return data


def _patch_data(control_plane: ControlPlane, namespace: str, name: str, changes: dict[str, str | None]) -> None:
    """A cluster administrator edits a Journal object directly."""
    control_plane.kubectl("patch", "journal", name, "-n", namespace, "--type=merge",
                          "-p", json.dumps({"data": changes}))


def _forged(stored: str, old: str, new: str) -> str:
    assert old in stored, stored
    return stored.replace(old, new)


async def test_namespace_roles_grant_configmaps_but_not_the_journal(
    control_plane: ControlPlane, namespace: str
) -> None:
    """The red team's ConfigMap editor: the built-in edit and admin roles may write ConfigMaps, and neither
    may read or write Journal objects, so the journal is out of their reach altogether."""
    for role in ("edit", "admin"):
        user = f"{role}-user"
        control_plane.kubectl("create", "rolebinding", f"{role}-binding", "-n", namespace,
                              f"--clusterrole={role}", f"--user={user}")

        def can(verb: str, resource: str, who: str = user) -> bool:
            out = control_plane.kubectl("auth", "can-i", verb, resource, "-n", namespace, "--as", who, check=False)
            return out.stdout.strip() == "yes"

        control_plane.wait_until(lambda: can("patch", "configmaps"), 30, f"the {role} RoleBinding to take effect")
        for verb in ("get", "list", "create", "patch", "update", "delete"):
            assert not can(verb, "journals.durable-sandbox.dev"), f"{role} may {verb} journals"
        # Before the move these were ConfigMaps and Leases, which these roles may write.
        assert can("update", "configmaps") and can("delete", "configmaps")


async def test_an_edited_command_is_detected_and_never_loaded(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    """Changing a later call's command in the run's input and a recorded call's output: the next load fails
    with JournalDamaged naming the object and the key; nothing of the forged values comes back."""
    await _run_with_calls(store, "forge-input", {"toolCalls": [{"type": "shell", "command": "echo one"}]})
    head = _journal(control_plane, namespace, "dsb.forge-input")
    _patch_data(control_plane, namespace, "dsb.forge-input",
                {"run.input": _forged(head["run.input"], "echo one", "cat /secret")})
    fresh = await _fresh(namespace)
    try:
        with pytest.raises(JournalDamaged) as caught:
            await fresh.get_run("forge-input")
        assert caught.value.tampered
        assert "dsb.forge-input" in str(caught.value) and "'run.input'" in str(caught.value)
        assert "cat /secret" not in str(caught.value)
    finally:
        await fresh.close()

    # A recorded output: the record is refused, not replayed.
    record_key = next(k for k, v in sorted(head.items()) if k.startswith("j.") and '"one\\n"' in v)
    _patch_data(control_plane, namespace, "dsb.forge-input", {
        "run.input": head["run.input"], record_key: _forged(head[record_key], "one\\n", "forged\\n")})
    fresh = await _fresh(namespace)
    try:
        assert (await fresh.get_run("forge-input")) is not None  # the input is back to what the operator wrote
        with pytest.raises(JournalDamaged, match=re.escape(record_key)):
            await fresh.load_journal("forge-input")
    finally:
        await fresh.close()


async def test_a_forged_signal_is_detected_and_the_real_one_is_not_refused_for_it(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    await _run_with_calls(store, "forge-signal", {})
    head = _journal(control_plane, namespace, "dsb.forge-signal")
    _patch_data(control_plane, namespace, "dsb.forge-signal",
                {"signals": _forged(head["signals"], '{"ok":true}', '{"ok":false,"by":"intruder"}')})
    fresh = await _fresh(namespace)
    try:
        with pytest.raises(JournalDamaged, match="'signals'"):
            await fresh.get_signals("forge-signal")
        with pytest.raises(JournalDamaged):
            await fresh.put_signal("forge-signal", "approve", {"ok": True})
    finally:
        await fresh.close()


async def test_values_cannot_be_moved_between_runs_or_namespaces(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    """A seal binds the value to its namespace, its run and its key: an authentic value copied elsewhere fails."""
    await _run_with_calls(store, "donor", {"toolCalls": [{"type": "shell", "command": "echo donor"}]})
    await _run_with_calls(store, "victim", {"toolCalls": [{"type": "shell", "command": "echo victim"}]})
    donor = _journal(control_plane, namespace, "dsb.donor")
    victim_head = _journal(control_plane, namespace, "dsb.victim")
    _patch_data(control_plane, namespace, "dsb.victim", {"run.input": donor["run.input"]})
    fresh = await _fresh(namespace)
    try:
        with pytest.raises(JournalDamaged, match=re.escape("dsb.victim")):
            await fresh.get_run("victim")
    finally:
        await fresh.close()

    # The same record under another seq of the same run (call 1's outcome replayed as call 2's), with the
    # run's own input put back.
    keys = sorted(k for k in victim_head if k.startswith("j."))
    _patch_data(control_plane, namespace, "dsb.victim",
                {"run.input": victim_head["run.input"], keys[3]: victim_head[keys[1]]})
    fresh = await _fresh(namespace)
    try:
        with pytest.raises(JournalDamaged, match=re.escape(keys[3])):
            await fresh.load_journal("victim")
    finally:
        await fresh.close()

    # Another namespace: the donor's head copied there whole, data and all.
    other_ns = namespace_with_crds(control_plane, "jtrust-other")
    try:
        body = control_plane.kubectl_json("get", "journal", "dsb.donor", "-n", namespace)
        copy = {"apiVersion": body["apiVersion"], "kind": "Journal", "run": body["run"], "part": body["part"],
                "metadata": {"name": "dsb.donor", "labels": body["metadata"]["labels"],
                             "annotations": body["metadata"].get("annotations") or {}},
                "data": body["data"]}
        control_plane.apply(copy, "-n", other_ns)
        elsewhere = await _fresh(other_ns)
        try:
            with pytest.raises(JournalDamaged, match=re.escape(other_ns)):
                await elsewhere.get_run("donor")
        finally:
            await elsewhere.close()
    finally:
        drop_namespace(control_plane, other_ns)


async def test_missing_or_undecodable_records_are_damage_not_a_shorter_journal(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    await _run_with_calls(store, "damaged", {})
    head = _journal(control_plane, namespace, "dsb.damaged")
    first = min(k for k in head if k.startswith("j."))
    _patch_data(control_plane, namespace, "dsb.damaged", {first: None})  # a record deleted
    fresh = await _fresh(namespace)
    try:
        with pytest.raises(JournalDamaged, match=r"records \[1\] of 1\.\.4 are missing") as caught:
            await fresh.load_journal("damaged")
        assert not caught.value.tampered
    finally:
        await fresh.close()


async def test_a_reader_without_the_key_reads_what_the_operator_wrote(namespace: str, store: KubernetesStore) -> None:
    """``dsb --kube`` reads with the user's credentials and no key: seals are stripped, values unchanged."""
    await _run_with_calls(store, "readable", {"toolCalls": []})
    reader = await _fresh(namespace, key=None)
    try:
        run = await reader.get_run("readable")
        assert run is not None and run.workflow == "sandbox-agent" and run.input == {"toolCalls": []}
        rows = await reader.load_journal("readable")
        assert [(r.op_id, r.status) for r in rows] == [
            ("ws/c1", "started"), ("ws/c1", "completed"), ("ws/c2", "started"), ("ws/c2", "completed")]
        assert rows[1].result == {"exitCode": 0, "stdout": "one\n", "stderr": ""}
        assert await reader.get_signals("readable") == {"approve": {"ok": True}}
    finally:
        await reader.close()

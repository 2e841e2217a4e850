"""Per-namespace journal keys (issue 39): a worker holds its namespace's key only, and what it seals opens in
its own namespace alone; the operator, holding the journal key, opens both its workers' seals and the seals
it made with the journal key itself before namespace keys existed."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.kube.journal.sealing import MARK, Sealer, namespace_key

ROOT = b"r" * 32


def test_namespace_keys_differ_per_namespace_and_from_the_journal_key() -> None:
    a, b = namespace_key(ROOT, "team-a"), namespace_key(ROOT, "team-b")
    assert len({a, b, ROOT}) == 3
    assert namespace_key(ROOT, "team-a") == a  # derived, not random: every replica derives the same
    assert namespace_key(b"x" * 32, "team-a") != a


def test_a_worker_seal_opens_for_the_operator_in_its_namespace_only() -> None:
    worker_a = Sealer(namespace_key(ROOT, "team-a"), "team-a", namespace_key=True)
    stored = worker_a.seal("run-1", "j.000000000001", '{"op":"c1"}')
    operator_a, operator_b = Sealer(ROOT, "team-a"), Sealer(ROOT, "team-b")
    assert operator_a.open("run-1", "j.000000000001", stored, run_id="run-1", where="w") == '{"op":"c1"}'
    with pytest.raises(JournalDamaged):
        operator_b.open("run-1", "j.000000000001", stored, run_id="run-1", where="w")


def test_a_worker_of_one_namespace_cannot_seal_for_another() -> None:
    """The hostile worker: A's key used as if it were B's (it claims to seal B's values) fails B's check."""
    forged = Sealer(namespace_key(ROOT, "team-a"), "team-b", namespace_key=True).seal("run-1", "run.status", '"succeeded"')
    with pytest.raises(JournalDamaged) as caught:
        Sealer(ROOT, "team-b").open("run-1", "run.status", forged, run_id="run-1", where="Journal team-b/dsb.run-1")
    assert caught.value.tampered


def test_the_operator_seals_with_the_namespace_key_which_the_worker_opens() -> None:
    stored = Sealer(ROOT, "team-a").seal("run-1", "run.input", "{}")
    worker = Sealer(namespace_key(ROOT, "team-a"), "team-a", namespace_key=True)
    assert worker.open("run-1", "run.input", stored, run_id="run-1", where="w") == "{}"


def _legacy_seal(key: bytes, namespace: str, scope: str, name: str, value: str) -> str:
    msg = b"".join((namespace.encode(), b"\0", scope.encode(), b"\0", name.encode(), b"\0", value.encode()))
    mac = base64.urlsafe_b64encode(hmac.new(key, msg, hashlib.sha256).digest()[:16]).decode().rstrip("=")
    return MARK + mac + value


def test_values_sealed_with_the_journal_key_itself_still_open_for_the_operator_not_for_a_worker() -> None:
    """A run in flight across the upgrade goes on; a worker cannot make (or accept) such a seal."""
    old = _legacy_seal(ROOT, "team-a", "run-1", "run.input", "{}")
    assert Sealer(ROOT, "team-a").open("run-1", "run.input", old, run_id="run-1", where="w") == "{}"
    with pytest.raises(JournalDamaged):
        Sealer(namespace_key(ROOT, "team-a"), "team-a", namespace_key=True).open(
            "run-1", "run.input", old, run_id="run-1", where="w")


async def test_whether_a_namespaces_key_was_handed_to_workers_is_its_secret_existing() -> None:
    """What the orphan sweep asks (kube/sweep/sweeper.py): a namespace whose worker-key Secret exists has workers
    that can seal as the operator does; where it may not read it, it could not have written it: no key handed; any
    other failure is an error (the sweep's round fails and is tried again), never a no."""
    from types import SimpleNamespace
    from typing import Any

    import pytest

    from durable_sandbox.kube.api.client import ApiException
    from durable_sandbox.kube.journal.worker_key import WORKER_KEY_SECRET, WorkerKeyError, worker_key_handed

    secrets: dict[str, Any] = {"team-a": object()}

    async def read(name: str, namespace: str) -> Any:
        assert name == WORKER_KEY_SECRET
        if namespace in ("locked", "away"):
            raise ApiException(status=403 if namespace == "locked" else 500, reason="Forbidden")
        if namespace not in secrets:
            raise ApiException(status=404, reason="Not Found")
        return secrets[namespace]

    api: Any = SimpleNamespace(core=SimpleNamespace(read_namespaced_secret=read))
    assert await worker_key_handed(api, "team-a") is True
    assert await worker_key_handed(api, "team-b") is False
    assert await worker_key_handed(api, "locked") is False
    with pytest.raises(WorkerKeyError, match="cannot read Secret away/durable-sandbox-worker-key"):
        await worker_key_handed(api, "away")

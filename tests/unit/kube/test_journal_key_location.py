"""Issue 32, item 8: where the journal key lives by default (the operator's own namespace, never a namespace its
users edit by accident) and the start-up checks of who else may read it (kube/journal/journal_key_readers.py). The
checks against a real API server: tests/e2e/test_journal_key_readers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sandbox.kube.journal.journal_key import (
    DEFAULT_SECRET_NAME,
    default_location,
    own_namespace,
    parse_location,
)
from durable_sandbox.kube.journal.journal_key_readers import (
    Subject,
    key_readers,
    readers_problem,
    served_namespace_problem,
)
from durable_sandbox.runs.errors import EXIT_FAILED
from tests.dsb import dsb


def test_the_key_is_in_the_operators_own_namespace(tmp_path: Path) -> None:
    pod_file = tmp_path / "namespace"
    pod_file.write_text("ops\n")
    missing = tmp_path / "absent"

    def outside() -> str:
        return "my-context-namespace"

    assert own_namespace({"POD_NAMESPACE": "chart-ns"}, pod_file) == "chart-ns", "the chart's POD_NAMESPACE first"
    assert own_namespace({}, pod_file) == "ops", "else the ServiceAccount's namespace, in a Pod made without the chart"
    assert own_namespace({}, missing) is None
    assert default_location(outside, environ={}, namespace_file=pod_file) == ("ops", DEFAULT_SECRET_NAME)
    # Run by hand outside a cluster: the kubeconfig context's namespace, as kubectl's, not a fixed `default`.
    assert default_location(outside, environ={}, namespace_file=missing) == ("my-context-namespace",
                                                                             DEFAULT_SECRET_NAME)
    assert parse_location("keys/k", outside) == ("keys", "k")


def test_a_key_in_a_namespace_the_operator_serves_is_refused() -> None:
    assert served_namespace_problem("ops", "k", ["team-a"]) is None
    assert served_namespace_problem("ops", "k", []) is None
    problem = served_namespace_problem("team-a", "k", ["team-a", "team-b"])
    assert problem is not None and "team-a/k" in problem and "edit role" in problem
    assert "--journal-key-secret NAMESPACE/NAME" in problem, "it says what to do"


def test_the_operator_does_not_start_with_its_key_in_a_namespace_it_serves(tmp_path: Path) -> None:
    ran = dsb("operator", "-n", "team-a", "--journal-key-secret", "team-a/key", process=True, timeout=60,
              env={"KUBECONFIG": str(tmp_path / "no-cluster")})
    assert ran.exit_code == EXIT_FAILED, ran.output
    assert "team-a/key is in namespace team-a, which this operator serves" in ran.output


class FakeQuestions:
    def __init__(self, subjects: list[Subject], readers: set[str], own: str = "system:serviceaccount:ops:operator",
                 allowed: bool = True) -> None:
        self.subjects, self.readers, self.own, self.allowed = subjects, readers, own, allowed
        self.asked: list[str] = []

    async def own_username(self) -> str:
        if not self.allowed:
            raise PermissionError("403 Forbidden")
        return self.own

    async def binding_subjects(self, namespace: str) -> list[Subject]:
        return self.subjects

    async def may_get_secret(self, subject: Subject, namespace: str, name: str) -> bool:
        self.asked.append(subject.username)
        return subject.username in self.readers


async def test_readers_other_than_the_operator_are_found_each_once() -> None:
    me = Subject("ServiceAccount", "operator", "ops")
    alice, viewers = Subject("User", "alice"), Subject("Group", "viewers")
    questions = FakeQuestions([me, alice, viewers, alice], readers={me.username, "alice"})
    assert await key_readers(questions, "ops", "k") == [alice]
    assert questions.asked == ["alice", "viewers"], "the operator itself is not asked about; alice once"
    assert await key_readers(FakeQuestions([me], readers={me.username}), "ops", "k") == []
    problem = readers_problem("ops", "k", [alice])
    assert "User alice" in problem and "ops/k" in problem and "--journal-key-secret" in problem


async def test_readers_are_not_checked_where_the_operator_may_not_ask() -> None:
    assert await key_readers(FakeQuestions([Subject("User", "alice")], {"alice"}, allowed=False), "ops", "k") is None


@pytest.mark.parametrize(("subject", "username"), [
    (Subject("ServiceAccount", "sa", "ns"), "system:serviceaccount:ns:sa"),
    (Subject("User", "bob"), "bob"),
])
def test_subjects_are_named_as_the_api_server_names_them(subject: Subject, username: str) -> None:
    assert subject.username == username

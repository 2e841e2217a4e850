"""Inputs the operator must refuse, bound or derive safely (issue 20), checked where they are judged: the
models (shared by `dsb run` and the operator), the generated CRD, the run plan, and the journal's seals."""

from __future__ import annotations

import re
from typing import Any

import pydantic
import pytest

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.journal.sealing import Sealer
from durable_sandbox.kube.spec import crds
from durable_sandbox.kube.spec.models import (
    SIGNAL_MAX_BYTES,
    SIGNALS_MAX_BYTES,
    WorkflowResource,
    without_refused_signals,
)
from durable_sandbox.kube.spec.plan import PlanError, WorkflowNotAllowed, WorkflowUnavailable, plan_workflow
from tests.builders import workflow_resource


def workflow(spec: dict[str, Any]) -> WorkflowResource:
    return workflow_resource(uid="0123456789ab", **spec)


def errors_of(spec: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """(location, message) of each error, the location as the operator reports it (with the ``subloc``)."""
    with pytest.raises(pydantic.ValidationError) as caught:
        workflow(spec)
    return [(tuple([*e["loc"], *(e.get("ctx") or {}).get("subloc", [])]), e["msg"]) for e in caught.value.errors()]


# --------------------------------------------------------------------------------------------- the journal's seals


def test_a_sealed_value_opens_only_where_it_was_sealed() -> None:
    sealer = Sealer(b"k" * 32, "team-a")
    stored = sealer.seal("run-1", "j.000000000001", '{"op":"c1"}')
    assert stored != '{"op":"c1"}' and stored.startswith("~")
    assert sealer.open("run-1", "j.000000000001", stored, run_id="run-1", where="dsb.run-1") == '{"op":"c1"}'
    wrong = [
        (sealer, "run-2", "j.000000000001", stored),  # another run
        (sealer, "run-1", "j.000000000002", stored),  # another key (a record moved to another seq)
        (Sealer(b"k" * 32, "team-b"), "run-1", "j.000000000001", stored),  # another namespace
        (Sealer(b"x" * 32, "team-a"), "run-1", "j.000000000001", stored),  # another key
        (sealer, "run-1", "j.000000000001", stored.replace("c1", "c2")),  # an edit
        (sealer, "run-1", "j.000000000001", '{"op":"c1"}'),  # no seal at all
    ]
    for opener, scope, name, text in wrong:
        with pytest.raises(JournalDamaged) as caught:
            opener.open(scope, name, text, run_id="run-1", where="Journal team-a/dsb.run-1")
        assert caught.value.tampered and f"key {name!r}" in str(caught.value)


def test_without_a_key_values_are_stored_as_they_are_and_seals_are_stripped() -> None:
    plain = Sealer(None, "team-a")
    assert plain.seal("run-1", "run.input", "{}") == "{}"
    sealed = Sealer(b"k" * 32, "team-a").seal("run-1", "run.input", '{"a":1}')
    assert plain.open("run-1", "run.input", sealed, run_id="run-1", where="x") == '{"a":1}'
    assert plain.open("run-1", "run.input", "@dsb.run-1.babc.0", run_id="run-1", where="x") == "@dsb.run-1.babc.0"


# --------------------------------------------------------------------------------------------- bounds and names


def test_a_signal_over_the_bound_is_refused_naming_its_key() -> None:
    big = "x" * SIGNAL_MAX_BYTES
    [(loc, msg)] = errors_of({"toolCalls": [{"type": "shell", "command": "true"}], "signals": {"approve": big}})
    assert loc == ("spec", "signals", "approve"), loc
    assert f"a signal may be at most {SIGNAL_MAX_BYTES}" in msg
    many = {f"s{i}": "y" * (SIGNAL_MAX_BYTES - 100) for i in range(SIGNALS_MAX_BYTES // SIGNAL_MAX_BYTES + 1)}
    [(loc, msg)] = errors_of({"toolCalls": [{"type": "shell", "command": "true"}], "signals": many})
    assert f"add up to more than {SIGNALS_MAX_BYTES} bytes" in msg and loc[-1] == sorted(many)[-1], (loc, msg)
    kept, refused = without_refused_signals({"spec": {"signals": {**many, "ok": 1}}})
    assert list(refused) == [sorted(many)[-1]], "the values that fit are kept, in key order"
    assert set(kept["spec"]["signals"]) == {"ok", *sorted(many)[:-1]}
    fine = workflow({"toolCalls": [{"type": "shell", "command": "true"}], "signals": {"ok": "y" * 1000}})
    assert fine.spec.signals == {"ok": "y" * 1000}


def test_label_values_from_long_or_odd_names_are_valid_and_distinct() -> None:
    valid = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
    names = ["box", "a" * 63, "a" * 64, "a" * 64 + "b", "b" * 253, "x." * 40 + "y", "-weird-"]
    values = [label_value(n) for n in names]
    assert values[0] == "box" and values[1] == "a" * 63, "valid values are kept as they are"
    for name, value in zip(names, values, strict=True):
        assert len(value) <= 63 and valid.fullmatch(value), (name, value)
    assert len(set(values)) == len(values)


def test_a_nul_byte_in_a_command_is_refused_by_the_models_and_the_crd() -> None:
    [(loc, msg)] = errors_of({"toolCalls": [{"type": "shell", "command": "echo a\x00b"}]})
    assert loc[-1] == "command" and "should match pattern" in msg
    calls = yaml_crd("workflows")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["toolCalls"]["items"]["properties"]
    assert calls["command"]["pattern"] == "^[^\\x00]*$", "the CRD refuses it at kubectl apply too"


def test_the_crd_refuses_backslash_dotdot_paths_as_the_models_do() -> None:
    for path in ("x\\..\\..\\y", "a\\..", "..\\x"):
        assert errors_of({"toolCalls": [{"type": "write_file", "path": path, "contents": ""}]})
        assert not re.match(crds.PATH_NO_DOTDOT, path), path
    for path in ("a\\b", "a\\.b", "dir/file.txt"):
        assert re.match(crds.PATH_NO_DOTDOT, path), path


def yaml_crd(plural: str) -> dict[str, Any]:
    [crd] = [c for c in crds.generate_crds() if c["spec"]["names"]["plural"] == plural]
    return crd


# --------------------------------------------------------------------------------------------- entrypoints


ALLOWED = ["tests.unit.entrypoint_policy_support"]


def test_an_entrypoint_that_is_not_a_workflow_is_a_final_error_not_code_missing_here() -> None:
    spec = {"entrypoint": "tests.unit.entrypoint_policy_support:not_a_workflow", "input": {}}
    with pytest.raises(PlanError, match="is not a workflow") as caught:
        plan_workflow(workflow(spec), source="team", cluster=True, allowed_modules=ALLOWED)
    assert not isinstance(caught.value, WorkflowUnavailable), "not-runnable-here is retried for ever; this is final"
    with pytest.raises(WorkflowUnavailable):  # code that is not here is still "not runnable here"
        plan_workflow(workflow({"entrypoint": "tests.unit.no_such_module_abc:flow", "input": {}}), source="team",
                      cluster=True, allowed_modules=["tests.unit"])


def test_an_allowed_module_cannot_reach_another_modules_workflow_through_an_attribute() -> None:
    spec = {"entrypoint": "tests.unit.entrypoint_policy_support:elsewhere.doubler", "input": {}}
    with pytest.raises(WorkflowNotAllowed, match=re.escape("defined in module 'tests.unit.cli_flows'")) as caught:
        plan_workflow(workflow(spec), source="team", cluster=True, allowed_modules=ALLOWED)
    assert caught.value.reason == "WorkflowNotAllowed"
    plan = plan_workflow(workflow(spec), source="team", cluster=True,
                         allowed_modules=[*ALLOWED, "tests.unit.cli_flows"])
    assert plan.definition.fn.__module__ == "tests.unit.cli_flows"


def test_no_name_is_looked_up_in_another_modules_objects() -> None:
    """Issue 32, item 8: a lookup in another module's object runs that module's code (a module's __getattr__, a
    descriptor), so the walk stops at the first step outside the allowed modules, whatever follows it."""
    for path in ("elsewhere.no_such_name", "elsewhere.doubler.__wrapped__"):
        spec = {"entrypoint": f"tests.unit.entrypoint_policy_support:{path}", "input": {}}
        with pytest.raises(WorkflowNotAllowed, match=re.escape(
                "reaches 'tests.unit.entrypoint_policy_support:elsewhere', defined in module 'tests.unit.cli_flows'")):
            plan_workflow(workflow(spec), source="team", cluster=True, allowed_modules=ALLOWED)

"""A workflow's input is checked against its parameter's annotation wherever it enters, plain types
included (`str`, `int`, `list[int] | None`, `dict[str, float]`, unions), as docs/cli.md says: `dsb run`,
`--dry-run`, a manifest's `spec.input`, the operator's plan of an entrypoint Workflow, `Engine.create`.
A mismatch exits 2 with one line naming the place, what was expected, what was given and the parameter;
nothing is created. A bare word for --input says how to quote it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durable_sandbox.engine import Engine
from durable_sandbox.engine.errors import InvalidInput
from durable_sandbox.kube.spec.models import WorkflowResource
from durable_sandbox.kube.spec.plan import PlanError, plan_workflow
from tests.dsb import dsb
from tests.unit import cli_flows

FLOWS = "tests.unit.cli_flows"

MISMATCHES = [
    ("named", '{"who": "Ada"}',
     'input: Input should be a valid string, given {"who": "Ada"} (parameter `who: str`)'),
    ("counted", '"abc"',
     'input: Input should be a valid integer, unable to parse string as an integer, given "abc" (parameter `n: int`)'),
    ("counted", "1.5",
     "input: Input should be a valid integer, got a number with a fractional part, given 1.5 (parameter `n: int`)"),
    ("tagged", '[1, "x"]',
     'input[1]: Input should be a valid integer, unable to parse string as an integer, given "x" '
     "(parameter `tags: list[int] | None`)"),
    ("tagged", '{"a": 1}', 'input: Input should be a valid list, given {"a": 1} (parameter `tags: list[int] | None`)'),
    ("scored", '{"a": "high"}',
     'input.a: Input should be a valid number, unable to parse string as a number, given "high" '
     "(parameter `scores: dict[str, float]`)"),
    ("either", "[]",
     "input: Input should be a valid integer, or Input should be a valid string, given [] (parameter `key: int | str`)"),
    ("greet", '{"times": "x"}',
     'input.name: Field required; input.times: Input should be a valid integer, unable to parse string as an '
     'integer, given "x" (parameter `params: Params`)'),
]


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize(("flow", "given", "message"), MISMATCHES, ids=[f"{m[0]}-{m[1]}" for m in MISMATCHES])
def test_input_that_does_not_match_the_annotation_exits_2_with_one_line(
    flow: str, given: str, message: str, dry_run: bool
) -> None:
    result = dsb("run", f"{FLOWS}:{flow}", "--input", given, *(["--dry-run"] if dry_run else []))
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {message}"]
    assert result.stdout == ""
    assert dsb("-o", "json", "runs").stdout.strip() == "[]"  # nothing was created


@pytest.mark.parametrize(
    ("flow", "given", "result"),
    [
        ("named", '"Ada"', "hello Ada"),
        ("counted", "41", 42),
        ("counted", '"41"', 42),  # pydantic's lax mode, as a model's fields have it: the workflow gets 41
        ("tagged", "null", 0),
        ("tagged", "[1, 2]", 3),
        ("scored", '{"a": 1, "b": 0.5}', 1.5),
        ("either", '"k"', "'k'"),
        ("either", "7", "7"),
        ("anything", '{"who": "Ada"}', "{'who': 'Ada'}"),  # unannotated: any JSON
    ],
)
def test_input_that_matches_runs_with_the_value_as_annotated(flow: str, given: str, result: object) -> None:
    dry = dsb("run", f"{FLOWS}:{flow}", "--input", given, "--dry-run")
    assert dry.exit_code == 0, dry.output
    ran = dsb("-o", "json", "run", f"{FLOWS}:{flow}", "--input", given)
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["result"] == result


def test_a_bare_word_as_input_says_how_to_pass_a_string(tmp_path: Path) -> None:
    result = dsb("run", f"{FLOWS}:named", "--input", "Ada")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --input is not valid JSON: Expecting value at line 1 column 1; a string needs JSON's double quotes: "
        "--input '\"Ada\"'"
    ]
    # The hint works as given.
    assert json.loads(dsb("-o", "json", "run", f"{FLOWS}:named", "--input", '"Ada"').stdout)["result"] == "hello Ada"
    path = tmp_path / "in.json"
    path.write_text("Ada\n")
    from_file = dsb("run", f"{FLOWS}:named", "--input-file", str(path))
    assert from_file.exit_code == 2
    assert from_file.stderr.strip().endswith("a string needs JSON's double quotes: \"Ada\"")  # JSON, not a shell word
    malformed = dsb("run", f"{FLOWS}:named", "--input", "{who: 1}")
    assert "double quotes: --input" not in malformed.stderr  # malformed JSON is not a missing pair of quotes


def test_a_manifests_spec_input_is_checked_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(
        "apiVersion: durable-sandbox.dev/v1alpha1\nkind: Workflow\nmetadata: {name: greet}\n"
        f"spec:\n  entrypoint: {FLOWS}:named\n  input: {{who: Ada}}\n"
    )
    for extra in ([], ["--dry-run"]):
        result = dsb("run", str(path), *extra)
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            f'error: {path}: Workflow/greet: spec.input: Input should be a valid string, given {{"who": "Ada"}} '
            "(parameter `who: str`)"
        ]
    assert dsb("-o", "json", "runs").stdout.strip() == "[]"


def test_the_operators_plan_of_an_entrypoint_workflow_refuses_it_as_an_invalid_spec() -> None:
    wf = WorkflowResource.model_validate({
        "metadata": {"name": "greet", "namespace": "team", "uid": "0123456789ab"},
        "spec": {"entrypoint": f"{FLOWS}:counted", "input": "abc"},
    })
    with pytest.raises(PlanError) as caught:  # what admission calls (kube/workflow/admission.py)
        plan_workflow(wf, source="team", cluster=True, allowed_modules=[FLOWS])
    assert caught.value.reason == "InvalidSpec"  # final: Failed, not retried as code missing here
    assert str(caught.value) == (
        'team: Workflow/greet: spec.input: Input should be a valid integer, unable to parse string as an integer, '
        'given "abc" (parameter `n: int`)'
    )


async def test_the_python_api_refuses_it_before_a_run_exists(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match=r"Input should be a valid string, given \{\"who\": \"Ada\"\} \(parameter `who: str`\)"):
        await engine.create(cli_flows.named, {"who": "Ada"}, run_id="api")
    assert await engine.store.get_run("api") is None

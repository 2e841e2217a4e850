"""The committed CRDs are what the models generate, their schemas are structural, and their names and printer
columns are as DESIGN section 2/7 specifies. (tests/e2e/test_crds.py proves them at a real API server.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_sandbox.kube.spec import crds
from tests.dsb import ROOT

CRD_DIR = ROOT / "crds"

# Keywords a structural schema node may carry (apiextensions.k8s.io/v1 JSONSchemaProps, minus what we never use).
ALLOWED = {
    "description", "type", "default", "format", "enum", "pattern", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "properties", "required", "items",
    "additionalProperties", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}  # fmt: skip
VALUE_VALIDATIONS = {"pattern", "minLength", "maxLength", "minimum", "maximum", "enum", "format"}


def structural_problems(node: Any, path: str = "") -> list[str]:
    """Why ``node`` is not a structural schema ([] when it is), in the API server's sense, as far as we use it."""
    if not isinstance(node, dict):
        return [f"{path or '<root>'}: not a schema object"]
    problems = [f"{path}: keyword {k!r} not allowed" for k in node if k not in ALLOWED | {"allOf"}]
    for combinator in ("oneOf", "anyOf", "not"):
        if combinator in node:
            problems.append(f"{path}: {combinator} (not used here)")
    # allOf of value validations only (several patterns): a junctor with types, descriptions or fields is not
    # structural.
    for member in node.get("allOf", []):
        if not isinstance(member, dict) or set(member) - VALUE_VALIDATIONS:
            problems.append(f"{path}: allOf member {member!r} is not a value validation")
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type and not x-kubernetes-preserve-unknown-fields")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: both properties and additionalProperties")
    if isinstance(node.get("additionalProperties"), bool):
        problems.append(f"{path}: additionalProperties must be a schema")
    if node.get("type") == "array" and "items" not in node:
        problems.append(f"{path}: array without items")
    if node.get("type") not in (None, "object") and ("properties" in node or "additionalProperties" in node):
        problems.append(f"{path}: properties on a non-object")
    for name, prop in node.get("properties", {}).items():
        problems += structural_problems(prop, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            problems += structural_problems(node[key], f"{path}.{key}")
    for required in node.get("required", []):
        if required not in node.get("properties", {}):
            problems.append(f"{path}: required {required!r} is not a property")
    return problems


def schema_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for prop in node.get("properties", {}).values():
        out += schema_nodes(prop)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out += schema_nodes(node[key])
    return out


def by_kind() -> dict[str, dict[str, Any]]:
    return {crd["spec"]["names"]["kind"]: crd for crd in crds.generate_crds()}


def openapi(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = by_kind()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crds_match_the_models() -> None:
    stale = crds.diff(CRD_DIR)
    assert not stale, f"crds/ is stale; regenerate with `{crds.REGENERATE}`\n{stale}"
    assert sorted(p.name for p in CRD_DIR.glob("*.yaml")) == sorted(crds.rendered_files())


def test_check_exits_1_with_a_diff_when_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crds.main(["--write", str(tmp_path)]) == 0
    capsys.readouterr()
    assert crds.main(["--check", str(tmp_path)]) == 0
    target = tmp_path / "workflows.durable-sandbox.dev.yaml"
    target.write_text(target.read_text().replace("shortNames:\n    - dwf", "shortNames:\n    - wf"))
    assert crds.main(["--check", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "-    - dwf" not in captured.out and "+    - dwf" in captured.out
    assert crds.REGENERATE in captured.err


def test_committed_files_are_the_crds_as_yaml() -> None:
    for crd in crds.generate_crds():
        text = (CRD_DIR / f"{crd['metadata']['name']}.yaml").read_text()
        assert text.startswith("# Generated") and crds.REGENERATE in text
        assert yaml.safe_load(text) == crd
    text = (CRD_DIR / crds.POLICY_FILE).read_text()
    assert list(yaml.safe_load_all(text)) == crds.generate_admission_policy()
    text = (CRD_DIR / crds.FORK_POLICY_FILE).read_text()
    assert list(yaml.safe_load_all(text)) == crds.generate_fork_policy()


def test_the_fork_policy_asks_the_authorizer_whether_the_creator_may_get_each_source() -> None:
    policy, binding = crds.generate_fork_policy()
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (match,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert match["operations"] == ["CREATE", "UPDATE"] and match["resources"] == ["sandboxes", "workflows"]
    checks = [v["expression"] for v in policy["spec"]["validations"]]
    for field, source in (("from.sandbox", "sandboxes"), ("from.workflow", "workflows"),
                          ("forkOf.workflow", "workflows")):
        [check] = [c for c in checks if f"name(object.spec.{field})" in c]
        assert f".resource('{source}').namespace(request.namespace)" in check and check.endswith(".check('get').allowed()")
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert "oldObject.spec.from != object.spec.from" in condition and "request.operation == 'CREATE'" in condition


@pytest.mark.parametrize("kind", ["Workflow", "Sandbox"])
def test_schema_is_structural(kind: str) -> None:
    schema = openapi(kind)
    assert structural_problems(schema) == []
    assert "$ref" not in yaml.safe_dump(schema)


def test_checker_rejects_what_is_not_structural() -> None:
    assert structural_problems({"type": "object", "properties": {"a": {}}})
    assert structural_problems({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}})
    assert structural_problems({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}})
    assert structural_problems({"type": "array"})
    assert structural_problems({"type": "object", "properties": {}, "additionalProperties": False})
    assert (
        structural_problems(
            {"type": "object", "properties": {"a": {"x-kubernetes-preserve-unknown-fields": True}}}
        )
        == []
    )


@pytest.mark.parametrize(
    ("kind", "plural", "short", "columns"),
    [
        ("Workflow", "workflows", "dwf", [
            ("Phase", "string", ".status.phase"), ("Calls", "integer", ".status.calls.completed"),
            ("Snapshot", "string", ".status.latestSnapshot"), ("Run", "string", ".status.runId"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]),
        ("Sandbox", "sandboxes", "dsbx", [
            ("Phase", "string", ".status.phase"), ("Provider", "string", ".status.provider"),
            ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
            ("State", "string", ".status.state"), ("Since", "date", ".status.stateSince"),
            ("Runtime", "string", ".status.handle.runtimeClassName"),  # priority 1: kubectl get -o wide
            ("Age", "date", ".metadata.creationTimestamp"),
        ]),
    ],
)  # fmt: skip
def test_names_versions_and_printer_columns(
    kind: str, plural: str, short: str, columns: list[tuple[str, str, str]]
) -> None:
    crd = by_kind()[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.durable-sandbox.dev"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("durable-sandbox.dev", "Namespaced")
    assert spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    got = [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert got == columns
    # Every printer column points at a field the schema declares (metadata is the server's).
    for _, _, json_path in columns:
        node = version["schema"]["openAPIV3Schema"]
        # A filter (`conditions[?(@.type=="Ready")]`) selects list items: follow the list's item schema.
        for part in re.sub(r"\[[^\]]*\]", "", json_path).strip(".").split("."):
            if node.get("type") == "array":
                node = node["items"]
            if node.get("type") == "object" and "properties" not in node:
                break
            node = node["properties"][part]


def test_preserve_unknown_fields_only_for_free_json() -> None:
    spec = openapi("Workflow")["properties"]["spec"]["properties"]
    status = openapi("Workflow")["properties"]["status"]["properties"]
    free = [n for n in schema_nodes(openapi("Workflow")) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert free == [
        spec["input"],
        spec["signals"]["additionalProperties"],
        status["pendingCallbacks"]["items"]["properties"]["payload"],
        status["result"],
        status["kopf"],  # kopf's progress storage: its own format
    ]
    assert all("type" not in n for n in free[:-1])
    assert status["kopf"]["type"] == "object"


def test_tool_calls_are_one_object_with_a_type_enum() -> None:
    items = openapi("Workflow")["properties"]["spec"]["properties"]["toolCalls"]["items"]
    assert items["type"] == "object"
    assert items["required"] == ["type"]
    assert items["properties"]["type"]["enum"] == ["shell", "write_file", "read_file"]
    assert set(items["properties"]) == {
        "type",
        "operationId",
        "command",
        "timeout",
        "cwd",
        "env",
        "path",
        "contents",
        "failurePolicy",
        "onReplay",
    }
    assert items["properties"]["onReplay"]["enum"] == ["rerun", "skip", "ask"]
    assert "default" not in items["properties"]["onReplay"], "absent means rerun: 10,000 calls store no default"
    assert items["properties"]["failurePolicy"]["properties"]["onTimeout"]["enum"] == ["continue", "fail"]
    messages = hoisted_messages(openapi("Workflow")["properties"]["spec"]["properties"]["toolCalls"])
    assert crds.TIMEOUT_POLICY_SHELL_ONLY in messages
    assert "a shell call requires command" in messages
    assert "a write_file call requires path and contents" in messages
    assert "a read_file call requires path" in messages
    assert openapi("Workflow")["properties"]["spec"]["properties"]["toolCalls"]["maxItems"] == 10_000


def hoisted_messages(node: dict[str, Any]) -> set[str]:
    """The messages of the item rules hoisted onto a list: the format() templates of its messageExpressions."""
    return {
        message
        for r in node.get("x-kubernetes-validations", [])
        for message in re.findall(r'"[a-zA-Z.]+\[%d\][a-zA-Z.]*: ([^"]*)"', r.get("messageExpression", ""))
    }


def test_no_rule_is_evaluated_per_tool_call_on_updates() -> None:
    # The API server evaluates every CEL rule over the whole object on every write, status writes included: a
    # rule under toolCalls' items would run 10,000 times per status write of a 10,000-call Workflow, and so
    # would a comparison of toolCalls with oldSelf.toolCalls (docs/kubernetes.md, "Admission rules").
    spec = openapi("Workflow")["properties"]["spec"]
    tool_calls = spec["properties"]["toolCalls"]
    assert not [n for n in schema_nodes(tool_calls["items"]) if "x-kubernetes-validations" in n]
    for r in tool_calls["x-kubernetes-validations"]:
        # Create-time: on any update the rule is decided by its first operand.
        assert r["optionalOldSelf"] is True and r["rule"].startswith("oldSelf.hasValue() || self.all(c, "), r
    for r in spec["x-kubernetes-validations"]:
        assert "self.toolCalls ==" not in r["rule"] and "oldSelf.toolCalls ==" not in r["rule"], r
    # Every item rule is still there, once.
    assert len(hoisted_messages(tool_calls)) == 8


def test_constraints_come_from_the_models() -> None:
    spec = openapi("Workflow")["properties"]["spec"]["properties"]
    assert (spec["snapshotEveryNCalls"]["minimum"], spec["snapshotEveryNCalls"]["maximum"]) == (0, 10_000)
    timeout = spec["toolCalls"]["items"]["properties"]["timeout"]
    assert (timeout["minimum"], timeout["exclusiveMinimum"], timeout["maximum"]) == (0, True, 86_400)
    assert spec["sandbox"]["properties"]["leaseSeconds"]["minimum"] == 60


def test_spec_rules_and_the_cancel_transition() -> None:
    rules = {r["message"]: r for r in openapi("Workflow")["properties"]["spec"]["x-kubernetes-validations"]}
    assert rules[crds.ONE_PROGRAM]["rule"] == "has(self.toolCalls) != has(self.entrypoint)"
    cancel = rules["spec.cancel cannot be set back to false once true"]
    assert "oldSelf.cancel" in cancel["rule"]
    assert crds.ONE_SANDBOX in rules


def test_conditions_have_the_metav1_shape() -> None:
    for kind in ("Workflow", "Sandbox"):
        conditions = openapi(kind)["properties"]["status"]["properties"]["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        item = conditions["items"]
        assert set(item["properties"]) == {
            "type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"
        }  # fmt: skip
        assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]


def test_docs_quote_every_admission_message() -> None:
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    messages = {
        r["message"]
        for crd in crds.generate_crds()
        for node in schema_nodes(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        for r in node.get("x-kubernetes-validations", [])
        if "optionalOldSelf" not in r
    } | {v["message"] for policy in (crds.generate_admission_policy(), crds.generate_fork_policy())
         for v in policy[0]["spec"]["validations"]}
    messages |= hoisted_messages(openapi("Workflow")["properties"]["spec"]["properties"]["toolCalls"])
    assert len(messages) == 32
    missing = [m for m in sorted(messages) if f"`{m}`" not in docs]
    assert not missing, f"docs/kubernetes.md does not quote: {missing}"
    assert crds.REGENERATE in docs


def properties(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(path, schema) of every declared field under ``node``, as kubectl explain walks them."""
    out = []
    for name, prop in node.get("properties", {}).items():
        out.append((f"{path}.{name}", prop))
        out += properties(prop, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out += properties(node[key], path + ("[]" if key == "items" else ".*"))
    return out


@pytest.mark.parametrize("kind", ["Workflow", "Sandbox"])
def test_every_field_has_a_description(kind: str) -> None:
    fields = properties(openapi(kind))
    assert len(fields) > (60 if kind == "Workflow" else 15)
    # metadata is the one exception: a CRD may not describe it; the API server documents it (ObjectMeta).
    undescribed = [p for p, prop in fields if not prop.get("description", "").strip() and p != ".metadata"]
    assert undescribed == [], f"kubectl explain would say <no description> for {undescribed}"


def test_spec_defaults_are_declared_and_status_has_none() -> None:
    spec = openapi("Workflow")["properties"]["spec"]["properties"]
    assert spec["snapshotEveryNCalls"]["default"] == 0
    assert spec["suspend"]["default"] is False and spec["cancel"]["default"] is False
    assert spec["retainLatestSnapshot"]["default"] is False
    # Unset on purpose: the operator's --default-provider decides (and pins) it, not the API server.
    assert "default" not in spec["sandbox"]["properties"]["provider"]
    assert "default" not in openapi("Sandbox")["properties"]["spec"]["properties"]["provider"]
    assert spec["sandbox"]["properties"]["leaseSeconds"]["default"] == 3600
    assert spec["retry"]["properties"]["maxAttempts"]["default"] == 3
    # No defaults for what has none in the models (absent means "not set") nor for containers.
    assert "default" not in spec["timeoutSeconds"] and "default" not in spec["signals"]
    status = openapi("Workflow")["properties"]["status"]
    assert [path for path, prop in properties(status) if "default" in prop] == []


def test_the_program_is_immutable_after_creation() -> None:
    rules = {r["message"]: r for r in openapi("Workflow")["properties"]["spec"]["x-kubernetes-validations"]}
    for field in ("toolCalls", "entrypoint", "sandbox", "sandboxRef"):
        rule = rules[crds.immutable_message(field)]
        assert f"oldSelf.{field}" in rule["rule"] and rule["fieldPath"] == f".{field}"
    policy, binding = crds.generate_admission_policy()
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (match,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # Updates of the main resource only: the status subresource is the operator's, written often.
    assert match["operations"] == ["UPDATE"] and match["resources"] == ["workflows"]
    messages = [v["message"] for v in policy["spec"]["validations"]]
    assert messages == [crds.immutable_message("toolCalls"), crds.INPUT_IMMUTABLE, crds.SIGNALS_ONLY_GAIN,
                        crds.REPLAY_ANSWERS]


def test_status_declares_every_field_the_operator_writes() -> None:
    status = set(openapi("Workflow")["properties"]["status"]["properties"])
    assert status == {
        "conditions", "observedGeneration", "phase", "runId", "runs", "calls", "currentCall", "pendingCallbacks",
        "wakeAt", "attempt", "maxAttempts", "error", "recentOperations", "journal", "sandbox", "latestSnapshot",
        "recoveryCount", "result", "resultRef", "startedAt", "finishedAt", "kopf",
    }  # fmt: skip


def test_docs_regenerating_commands_write_the_committed_crds(tmp_path: Path) -> None:
    """docs/kubernetes.md's "Regenerating" commands, as written, in a scratch copy of the two CRD directories
    emptied first: they write exactly the committed files, and the check then passes."""
    from tests.docs_commands import REGEN, commands_run_by, failed, shell

    dirs = [Path("crds"), Path("charts/durable-sandbox/crds")]
    for d in dirs:
        (tmp_path / d).mkdir(parents=True)
        for f in (ROOT / d).glob("*.yaml"):
            (tmp_path / d / f.name).write_text("")
    commands = commands_run_by(REGEN)
    assert [c.text.split()[-2:] for c in commands] == [["--write", "crds/"],
                                                       ["--write", "charts/durable-sandbox/crds/"],
                                                       ["--check", "crds/"]]
    for command in commands:
        done = shell(command, cwd=tmp_path)
        assert done.returncode == 0, failed(command, done)
    for d in dirs:
        committed = {f.name: f.read_text() for f in (ROOT / d).glob("*.yaml")}
        assert {f.name: f.read_text() for f in (tmp_path / d).glob("*.yaml")} == committed, d

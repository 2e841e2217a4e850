"""CustomResourceDefinitions for ``Workflow`` and ``Sandbox``, generated from the resource models, and the
``Journal`` kind the operator keeps its records in.

The ``openAPIV3Schema`` of each CRD is the pydantic JSON schema of :mod:`durable_sandbox.kube.spec.models`
(``model_json_schema(by_alias=True)``) rewritten into a *structural* schema, the form the API server
requires: every ``$ref`` inlined, ``anyOf [X, null]`` reduced to ``X`` (a null field is pruned, i.e.
absent, which is what ``None`` means in the models), the discriminated union of tool calls merged into
one object whose ``type`` is an enum, and free JSON values marked ``x-kubernetes-preserve-unknown-fields``.

What a JSON schema cannot say (the models' validators) is added as CEL rules (``x-kubernetes-validations``),
so ``kubectl apply`` rejects a bad manifest with a clear message. Checks CEL cannot make at admission
(a provider installed in the operator, a path that climbs out and back in) are left to the operator,
which loads every object through the same models.

Rules are placed so that writes to a big Workflow stay cheap. The API server evaluates every CEL rule of the
CRD over the whole object on *every* write, status-subresource writes included (only the OpenAPI keywords of
spec are skipped there). A rule on each of 10,000 tool calls, or a transition rule comparing 10,000 calls with
the stored ones, made each status patch of a 10,000-call Workflow cost seconds. So: the per-call rules are
hoisted onto the ``toolCalls`` list as create-time rules (``optionalOldSelf``: ``oldSelf.hasValue() || ...``
is O(1) on every update, where the program cannot change anyway), and the comparison of the calls with the
stored ones is in the admission policy, which sees updates of the Workflow itself but not its status writes.

``python -m durable_sandbox.kube.spec.crds --write crds/`` regenerates the committed YAML;
``--check crds/`` exits 1 with a diff when it is stale.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from durable_sandbox.kube.api.resources import GROUP, POOLS, SANDBOXES, SCHEDULES, VERSION, WORKFLOWS
from durable_sandbox.kube.spec.models import (
    _ENTRYPOINT,
    FORK_NEEDS_TOOL_CALLS,
    WORKER_NEEDS_ENTRYPOINT,
    WORKER_QUEUE_PATTERN,
    SandboxPoolResource,
    SandboxResource,
    WorkflowResource,
)
from durable_sandbox.kube.spec.schedule_models import WorkflowScheduleResource
from durable_sandbox.sandboxes.journal import RESERVED_HEADS
from durable_sandbox.schedules import NAME_MAX
from durable_sandbox.workflows.sandbox_agent import PATH_MAX_LENGTH

Schema = dict[str, Any]

REGENERATE = "python -m durable_sandbox.kube.spec.crds --write crds/"
HEADER = (
    f"# Generated from durable_sandbox.kube.spec.models by `{REGENERATE}`; do not edit.\n"
    "# tests/unit/kube/test_crds.py fails when this file differs from what the models generate.\n"
)

PRESERVE = "x-kubernetes-preserve-unknown-fields"
VALIDATIONS = "x-kubernetes-validations"


def rule(expr: str, message: str, **extra: str) -> dict[str, str]:
    return {"rule": expr, "message": message, **extra}


# ------------------------------------------------------------------------------------------- CEL rules

# Messages are part of the interface: docs/kubernetes.md quotes them and tests/e2e/test_crds.py expects them.
ONE_PROGRAM = "set exactly one of toolCalls or entrypoint"
ONE_SANDBOX = "set at most one of sandbox or sandboxRef"
CANCEL_FINAL = "spec.cancel cannot be set back to false once true"
ENV_ONE_SOURCE = "set exactly one of value or valueFrom"
TIMEOUT_POLICY_SHELL_ONLY = "failurePolicy.onTimeout applies only to shell calls (only they have a timeout)"
LOSS_WITHIN_CALLS = "injectLossAfterNCalls must be at most the number of toolCalls (the loss would never happen)"
# The program of a run is fixed at creation: the journal records what ran, and a replay must meet the same calls.
PROGRAM_FIELDS = ("toolCalls", "entrypoint", "sandbox", "sandboxRef", "worker", "forkOf")
# Compared with the stored value by the admission policy rather than a CRD rule: up to 10,000 calls are too
# many to compare on every status write (the CRD keeps only the O(1) check that the field neither appears nor
# disappears).
POLICY_COMPARED = frozenset({"toolCalls"})


def immutable_message(field: str) -> str:
    return (
        f"spec.{field} cannot change after creation: a run's program is fixed when it is created "
        f"(create a new Workflow to run a changed one)"
    )


def immutable_rule(field: str) -> dict[str, str]:
    """A transition rule (it refers to oldSelf, so it is evaluated on update only): ``field`` neither appears,
    disappears nor changes. Made on spec rather than on the field, where it would not see it added or removed.
    For the fields in POLICY_COMPARED only appearing and disappearing (the policy compares the values)."""
    presence = f"has(self.{field}) == has(oldSelf.{field})"
    expr = presence if field in POLICY_COMPARED else f"{presence} && (!has(self.{field}) || self.{field} == oldSelf.{field})"
    return rule(expr, immutable_message(field), fieldPath=f".{field}")


RESERVED_OPERATION_ID = (
    "operationId is reserved for the sandbox session's own records "
    f"(ids starting with {', '.join(sorted(RESERVED_HEADS))})"
)


# Workspace paths (``path``, ``cwd``) are checked with OpenAPI patterns rather than CEL: up to 10,000 calls have
# them, a regular expression is checked by the API server in Go far faster than CEL evaluates the same checks
# (with 3 CEL rules per path, creating a 10,000-call Workflow timed out on a busy server), and spec's OpenAPI
# keywords are not re-checked on status writes. Each pattern is one rule, so the API server's message
# (`spec.toolCalls[2].path in body should match '^[^/\\]'`) says which one was broken:
PATH_RELATIVE = r"^[^/\\]"  # not absolute: starts with neither '/' nor '\'
# Segments are separated by '/' or '\', as the models judge them (sandbox_agent.manifest_path): `x\..\y` is refused
# at admission too, not admitted and then failed by the operator.
_SEGMENT = r"(\.?|\.?[^/\\.][^/\\]*|\.\.[^/\\]+)"  # any path segment but '..'
PATH_NO_DOTDOT = rf"^{_SEGMENT}([/\\]{_SEGMENT})*$"
PATH_NAMES_SOMETHING = "[^./]"  # without '..' segments, a path names nothing only when it is all '.' and '/'


# What ``safe_relative_path`` enforces, as far as a pattern can say it. Stricter than the models in one respect:
# any ``..`` segment is refused, while ``dsb run`` accepts one that stays inside the workspace (``a/../b``); a
# pattern has no path normalisation to tell the two apart.
PATH_SCHEMA: Final[Mapping[str, Any]] = {
    "minLength": 1,
    "maxLength": PATH_MAX_LENGTH,
    "allOf": [{"pattern": PATH_RELATIVE}, {"pattern": PATH_NO_DOTDOT}, {"pattern": PATH_NAMES_SOMETHING}],
}


# Rules attached to a model (by its JSON-schema title) wherever it appears.
MODEL_RULES: Final[Mapping[str, Sequence[Mapping[str, str]]]] = {
    "WorkflowSpec": [
        rule("has(self.toolCalls) != has(self.entrypoint)", ONE_PROGRAM),
        rule("!(has(self.sandbox) && has(self.sandboxRef))", ONE_SANDBOX),
        rule("!has(self.worker) || has(self.entrypoint)", WORKER_NEEDS_ENTRYPOINT, fieldPath=".worker"),
        rule("!has(self.forkOf) || (has(self.toolCalls) && !has(self.sandboxRef))", FORK_NEEDS_TOOL_CALLS,
             fieldPath=".forkOf"),
        rule(
            "!has(self.injectLossAfterNCalls) || !has(self.toolCalls) || self.injectLossAfterNCalls <= size(self.toolCalls)",
            LOSS_WITHIN_CALLS,
            fieldPath=".injectLossAfterNCalls",
        ),
        # A transition rule: evaluated on update only, against the stored object.
        rule(
            "!has(oldSelf.cancel) || !oldSelf.cancel || (has(self.cancel) && self.cancel)",
            CANCEL_FINAL,
            fieldPath=".cancel",
        ),
        *(immutable_rule(field) for field in PROGRAM_FIELDS),
    ],
    "EnvVar": [rule("has(self.value) != has(self.valueFrom)", ENV_ONE_SOURCE)],
    "SandboxSource": [rule("has(self.sandbox) != has(self.workflow)", "set exactly one of sandbox or workflow")],
    "SandboxResourceSpec": [rule(
        "has(self.from) == has(oldSelf.from) && (!has(self.from) || self.from == oldSelf.from)",
        "spec.from cannot change after creation: a fork starts from its source once (create a new Sandbox to "
        "start from another point)", fieldPath=".from")],
    # Merged into the one tool-call object (see _Converter.discriminated), hence the type test.
    "ShellCall": [
        rule(
            "self.type == 'shell' || !has(self.failurePolicy) || !has(self.failurePolicy.onTimeout)",
            TIMEOUT_POLICY_SHELL_ONLY,
        )
    ],
}

# Keywords added to one property of a model (model title, property alias).
_OPERATION_ID: Final[Mapping[str, Any]] = {
    VALIDATIONS: [
        rule(
            " && ".join(f"self != '{h}' && !self.startsWith('{h}/')" for h in sorted(RESERVED_HEADS)),
            RESERVED_OPERATION_ID,
        )
    ]
}
FIELD_EXTRAS: Final[Mapping[tuple[str, str], Mapping[str, Any]]] = {
    ("WorkflowSpec", "entrypoint"): {
        "pattern": _ENTRYPOINT.pattern,
        "description": "A 'package.module:function' reference to a workflow function.",
    },
    ("WorkerSpec", "queue"): {"pattern": WORKER_QUEUE_PATTERN, "maxLength": 40},
    ("ShellCall", "cwd"): PATH_SCHEMA,
    ("WriteFileCall", "path"): PATH_SCHEMA,
    ("ReadFileCall", "path"): PATH_SCHEMA,
    ("ShellCall", "operationId"): _OPERATION_ID,
    ("WriteFileCall", "operationId"): _OPERATION_ID,
    ("ReadFileCall", "operationId"): _OPERATION_ID,
}


# Lists whose items' rules are evaluated once, when the object is created (model title, property alias) -> the
# field's path in messages. See the module docstring: per-item rules would be evaluated on every write.
HOISTED: Final[Mapping[tuple[str, str], str]] = {("WorkflowSpec", "toolCalls"): "spec.toolCalls"}


def hoist_item_rules(array: Schema, where: str) -> Schema:
    """The CEL rules of an array's items (and of the items' fields) moved onto the array as create-time rules.

    Each group of rules becomes ``oldSelf.hasValue() || self.all(c, <the rules, of c>)`` with
    ``optionalOldSelf``. On create oldSelf is none and every item is checked; on any update
    (status writes included) the rule is decided at once. A pass over the list per rule costs a conversion of
    every item per rule (14 rules made creating a 10,000-call Workflow 2-3 times slower than per-item rules),
    so rules share a pass as far as the API server's cost limit for one rule allows. Its
    message names the first offending item and the first rule it breaks: ``spec.toolCalls[3].path: path must
    be relative ...``.
    """
    items = copy.deepcopy(array["items"])
    # As few passes as the cost limit of one rule allows. Group i has the i-th rule of every field (the items' own
    # rules and a short field's all go in group 0): the checks of one workspace path cost in proportion to its
    # maxLength, and together exceed the limit; a regex match (in proportion to length times pattern) goes alone.
    groups: dict[Any, list[tuple[str, str]]] = {0: [_over_items(r, "c", None, where, "") for r in items.pop(VALIDATIONS, [])]}
    for name, prop in items.get("properties", {}).items():
        long = prop.get("maxLength", 0) > 256
        for i, r in enumerate(prop.pop(VALIDATIONS, [])):
            key = (name, i) if ".matches(" in r["rule"] else i if long else 0
            groups.setdefault(key, []).append(_over_items(r, f"c.{name}", f"has(c.{name})", where, f".{name}"))
        if _has_rules(prop):
            raise ValueError(f"{where}[].{name}: rules below an item's own fields cannot be hoisted")
    hoisted = [_one_pass(checks, where) for checks in groups.values() if checks]
    return {**array, "items": items, VALIDATIONS: [*array.get(VALIDATIONS, []), *hoisted]}


def _one_pass(checks: list[tuple[str, str]], where: str) -> Schema:
    every = " && ".join(f"({expr})" for expr, _ in checks)
    # Evaluated only when the rule fails: the first check some item breaks, and the first item breaking it. The
    # index is the position of the first item equal to it (an earlier equal item breaks the check too). Written
    # so that the API server can bound its cost, or it refuses the CRD: not self.map(...).indexOf(false) (a list
    # built by map has no size bound) and format() rather than `+` (nor has a string built by string()).
    def found(expr: str, template: str) -> str:
        return f"{json.dumps(template)}.format([self.indexOf(self.filter(c, !({expr}))[0])])"

    # When the rule fails and no other check is broken, the last one is: no test for it (one pass less).
    explain = found(*checks[-1])
    for expr, template in reversed(checks[:-1]):
        explain = f"self.exists(c, !({expr})) ? {found(expr, template)} : {explain}"
    return {
        "rule": f"oldSelf.hasValue() || self.all(c, {every})",
        "optionalOldSelf": True,
        # Used if the messageExpression cannot be evaluated.
        "message": "; ".join(t.replace("[%d]", "[]") for _, t in checks),
        "messageExpression": explain,
    }


def _over_items(item_rule: dict[str, str], subject: str, guard: str | None, where: str, suffix: str) -> tuple[str, str]:
    """(the rule about one item ``c``, its message as a format() template taking the item's index)."""
    if set(item_rule) - {"rule", "message"}:
        raise ValueError(f"cannot hoist a rule with {sorted(set(item_rule) - {'rule', 'message'})}: {item_rule}")
    # The item rules are written about `self`; here they are about one item `c` (or its field).
    expr = re.sub(r"\bself\b", subject, item_rule["rule"])
    if guard is not None:
        expr = f"!{guard} || ({expr})"
    message = item_rule["message"]
    if "%" in message:
        raise ValueError(f"a hoisted rule's message is a format() template and cannot contain '%': {message}")
    return expr, f"{where}[%d]{suffix}: {message}"


def _has_rules(node: Any) -> bool:
    if isinstance(node, dict):
        return VALIDATIONS in node or any(_has_rules(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_rules(v) for v in node)
    return False


# ------------------------------------------------------------------------------------------- structural

_DROP = frozenset({"title", "default", "additionalProperties", "discriminator", "propertyNames", "patternProperties"})


class _Converter:
    """Rewrites one pydantic JSON schema (with its ``$defs``) into a structural schema."""

    def __init__(self, schema: Schema, *, defaults: bool = False) -> None:
        self.defs: dict[str, Schema] = schema.get("$defs", {})
        # Declared defaults are applied by the API server (kubectl get -o yaml shows the effective spec); only
        # in spec: status is the operator's to write, whole.
        self.defaults = defaults
        self.used_model_rules: set[str] = set()
        self.used_field_extras: set[tuple[str, str]] = set()

    def deref(self, node: Schema) -> Schema:
        while "$ref" in node:
            name = node["$ref"].removeprefix("#/$defs/")
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            node = {**self.defs[name], **siblings}
        return node

    def convert(self, node: Schema) -> Schema:
        node = self.deref(node)
        if "anyOf" in node or "oneOf" in node:
            return self.union(node)
        if "type" not in node:
            # JsonValue / Any: a free JSON value of any type.
            described = {"description": node["description"]} if "description" in node else {}
            return {**described, PRESERVE: True}

        out: Schema = {}
        if "description" in node:
            out["description"] = node["description"].strip()
        default = node.get("default")
        if default is not None and not isinstance(default, dict | list):
            out["description"] = (out.get("description", "") + f" Default: {json.dumps(default)}.").strip()
            if self.defaults:
                out["default"] = default
        for key, value in node.items():
            if key in _DROP or key in ("description", "properties", "items", "required", "const"):
                continue
            if key == "exclusiveMinimum":
                out["minimum"], out["exclusiveMinimum"] = value, True
            elif key == "exclusiveMaximum":
                out["maximum"], out["exclusiveMaximum"] = value, True
            else:
                out[key] = value
        if "const" in node:
            out["enum"] = [node["const"]]

        title = node.get("title")
        if node.get("type") == "object":
            if "properties" in node:
                props: Schema = {}
                for name, prop in node["properties"].items():
                    converted = self.convert(prop)
                    extras = FIELD_EXTRAS.get((title or "", name))
                    if extras is not None:
                        self.used_field_extras.add((title or "", name))
                        converted = _with_extras(converted, extras)
                    where = HOISTED.get((title or "", name))
                    if where is not None:
                        self.used_field_extras.add((title or "", name))
                        converted = hoist_item_rules(converted, where)
                    props[name] = converted
                out["properties"] = props
                if node.get("required"):
                    out["required"] = list(node["required"])
            elif isinstance(node.get("additionalProperties"), dict):
                out["additionalProperties"] = self.convert(node["additionalProperties"])
            elif len(node.get("patternProperties", {})) == 1:
                # A map whose keys have a pattern (env names): structural schemas cannot constrain keys,
                # so admission checks the values and the models (operator, `dsb run`) check the keys.
                (values,) = node["patternProperties"].values()
                out["additionalProperties"] = self.convert(values)
            else:
                out[PRESERVE] = True
        if node.get("type") == "array":
            out["items"] = self.convert(node.get("items", {}))
        if title is not None and title in MODEL_RULES:
            self.used_model_rules.add(title)
            out[VALIDATIONS] = copy.deepcopy(MODEL_RULES[title])
        # description and type first: the YAML reads like a hand-written CRD.
        head: Schema = {k: out[k] for k in ("description", "type") if k in out}
        return {**head, **out}

    def union(self, node: Schema) -> Schema:
        alternatives: list[Schema] = node.get("anyOf") or node.get("oneOf") or []
        branches = [self.deref(b) for b in alternatives if b != {"type": "null"}]
        siblings = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
        if len(branches) == 1:
            # `X | None`: null is pruned by the API server, i.e. the field is absent, as None means in the models.
            return self.convert({**branches[0], **siblings})
        discriminator = node.get("discriminator", {}).get("propertyName")
        if discriminator is None:
            raise ValueError(f"cannot express a non-discriminated union structurally: {node}")
        return self.discriminated(branches, discriminator, siblings)

    def discriminated(self, variants: list[Schema], key: str, siblings: Schema) -> Schema:
        """One object with every variant's fields optional and ``key`` an enum, plus CEL rules for the rest."""
        tags = [v["properties"][key]["const"] for v in variants]
        fields: dict[str, Schema] = {}
        owners: dict[str, list[str]] = {}
        rules: list[dict[str, str]] = []
        for tag, variant in zip(tags, variants, strict=True):
            converted = self.convert(variant)
            for name, prop in converted["properties"].items():
                if name == key:
                    continue
                if name in fields and fields[name] != prop:
                    raise ValueError(f"field {name!r} differs between variants of the {key!r} union")
                fields[name] = prop
                owners.setdefault(name, []).append(tag)
            needed = [r for r in converted.get("required", []) if r != key]
            if needed:
                rules.append(
                    rule(
                        f"self.{key} != '{tag}' || ({' && '.join(f'has(self.{r})' for r in needed)})",
                        f"a {tag} call requires {_and(needed)}",
                    )
                )
            rules.extend(converted.get(VALIDATIONS, []))
        # Fields that only some variants have: refused on the others (the models forbid extra fields).
        by_owners: dict[tuple[str, ...], list[str]] = {}
        for name, tagged in owners.items():
            if len(tagged) < len(tags):
                by_owners.setdefault(tuple(tagged), []).append(name)
        for owning, names in by_owners.items():
            allowed = ", ".join(f"'{t}'" for t in owning)
            present = " || ".join(f"has(self.{n})" for n in names)
            rules.append(
                rule(
                    f"self.{key} in [{allowed}] || !({present})",
                    f"{_and(names)} {'applies' if len(names) == 1 else 'apply'} only to {_or(list(owning))} calls",
                )
            )
        out: Schema = {}
        if "description" in siblings:
            out["description"] = siblings["description"]
        out["type"] = "object"
        out["required"] = [key]
        kinds = "; ".join(f"{tag}: {v['description'].strip()}" if "description" in v else tag for tag, v in zip(tags, variants, strict=True))
        out["properties"] = {
            key: {"type": "string", "enum": tags, "description": f"The kind of call. {kinds}"},
            **fields,
        }
        out[VALIDATIONS] = rules
        return out


def _with_extras(schema: Schema, extras: Mapping[str, Any]) -> Schema:
    out = dict(schema)
    for key, value in extras.items():
        # A copy: an object shared between fields would be written as a YAML anchor and alias.
        out[key] = [*out.get(key, []), *copy.deepcopy(value)] if key == VALIDATIONS else copy.deepcopy(value)
    return out


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


# ------------------------------------------------------------------------------------------- CRDs


def structural_schema(model: type[BaseModel], description: str) -> Schema:
    """The resource's openAPIV3Schema: spec and status from the model; apiVersion/kind/metadata as Kubernetes has them."""
    schema = model.model_json_schema(by_alias=True)
    props = schema["properties"]
    spec = _Converter(schema, defaults=True).convert(props["spec"])
    status = _Converter(schema).convert(props["status"])
    # metav1.Condition lists are maps keyed by type (as +listType=map +listMapKey=type in Go).
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    out: Schema = {
        "description": description,
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION_DOC},
            "kind": {"type": "string", "description": KIND_DOC},
            # The API server allows nothing else here (kubectl explain shows ObjectMeta's own documentation).
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if "spec" in schema.get("required", []):
        out["required"] = ["spec"]
    return out


# The descriptions every Kubernetes type has for these (kubectl explain shows them).
API_VERSION_DOC = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values."
)
KIND_DOC = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer this "
    "from the endpoint the client submits requests to. In CamelCase."
)

_AGE: Final[Mapping[str, str | int]] = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _crd(
    kind: str, plural: str, short: str, schema: Schema, columns: list[dict[str, str | int]], categories: list[str],
    *, status: bool = True,
) -> Schema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": categories,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    **({"subresources": {"status": {}}} if status else {}),
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def journal_schema() -> Schema:
    """The ``Journal`` kind: what the operator keeps of runs and Sandboxes (``kube/store/``,
    ``kube/journal/leases.py``). Shaped like a ConfigMap (a ``data`` map of strings, so the store's fenced JSON
    Patches address ``/data/<key>``), plus two plain fields for ``kubectl get``. A kind of its own because
    namespace roles (``edit``, ``admin``) grant ConfigMaps: whoever could write the journal could change what
    a run executes, what it was told and what the operator deletes. Nothing but the operator writes it."""
    text = {"type": "string"}
    return {
        "type": "object",
        "description": (
            "The operator's own record of a run or a Sandbox (run head, journal chunk, large value, run events, "
            "thread state, cache entry, lease, Sandbox state). Written only by the operator; values are "
            "authenticated, so an edit is detected and refused, never replayed."
        ),
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION_DOC},
            "kind": {"type": "string", "description": KIND_DOC},
            "metadata": {"type": "object"},
            "run": {**text, "description": "The run (or Sandbox) this object belongs to."},
            "part": {**text, "description": "What this object holds: run, journal, blob, events, thread, cache, "
                                            "lease or sandbox."},
            "data": {
                "type": "object",
                "additionalProperties": text,
                "description": "The store's values, one per key (see docs/kubernetes.md, 'The journal').",
            },
        },
    }


# Long on purpose: the four CRDs' printer columns and rules, declared side by side (data, not logic).
def generate_crds() -> list[Schema]:
    """The Workflow, Sandbox, Journal and SandboxPool CRDs (apiextensions.k8s.io/v1), in that order."""
    workflow = _crd(
        "Workflow",
        WORKFLOWS,
        "dwf",
        structural_schema(
            WorkflowResource,
            "A durable run: the built-in sandbox-agent over spec.toolCalls, or a workflow function "
            "(spec.entrypoint), journaled so that it survives operator restarts and sandbox loss.",
        ),
        [
            {
                "name": "Phase",
                "type": "string",
                "jsonPath": ".status.phase",
                "description": "Where the run is.",
            },
            {
                "name": "Calls",
                "type": "integer",
                "jsonPath": ".status.calls.completed",
                "description": "Tool calls completed (status.calls.total has the total).",
            },
            {
                "name": "Snapshot",
                "type": "string",
                "jsonPath": ".status.latestSnapshot",
                "description": "The latest sandbox snapshot taken.",
            },
            {
                "name": "Run",
                "type": "string",
                "jsonPath": ".status.runId",
                "priority": 1,
                "description": "The run the Workflow is at: after ctx.continue_as_new, the newest of its chain "
                "(status.runs).",
            },
            dict(_AGE),
        ],
        ["durable-sandbox"],
    )
    sandbox = _crd(
        "Sandbox",
        SANDBOXES,
        "dsbx",
        structural_schema(
            SandboxResource,
            "A sandbox held by a provider, which Workflows can share through spec.sandboxRef.",
        ),
        [
            {
                "name": "Phase",
                "type": "string",
                "jsonPath": ".status.phase",
                "description": "Where the sandbox is.",
            },
            {
                "name": "Provider",
                "type": "string",
                "jsonPath": ".status.provider",
                "description": "The sandbox provider (spec.provider, or the operator's default when unset).",
            },
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                "description": "Whether the live sandbox is ready for tool calls.",
            },
            {
                "name": "State",
                "type": "string",
                "jsonPath": ".status.state",
                "description": "Ready (held by a Workflow), Idle (live, unheld) or Suspended (no live sandbox).",
            },
            {
                "name": "Since",
                "type": "date",
                "jsonPath": ".status.stateSince",
                "description": "How long the state has held.",
            },
            {
                "name": "Runtime",
                "type": "string",
                "jsonPath": ".status.handle.runtimeClassName",
                "description": "The RuntimeClass the live sandbox runs under (gVisor, Kata...), when its provider says.",
                "priority": 1,  # kubectl get -o wide
            },
            dict(_AGE),
        ],
        ["durable-sandbox"],
    )
    journal = _crd(
        "Journal",
        "journals",
        "dsbj",
        journal_schema(),
        [
            {"name": "Run", "type": "string", "jsonPath": ".run", "description": "The run or Sandbox it belongs to."},
            {"name": "Part", "type": "string", "jsonPath": ".part", "description": "What it holds."},
            {"name": "Holder", "type": "string", "jsonPath": ".data.holder",
             "description": "Of a lease: the operator replica that holds it."},
            dict(_AGE),
        ],
        [],  # not in `kubectl get durable-sandbox`: these are the operator's, not the user's
        status=False,
    )
    pool = _crd(
        "SandboxPool",
        POOLS,
        "dsbpool",
        structural_schema(
            SandboxPoolResource,
            "Warm sandbox Pods of one PodTemplate (the kubernetes provider): a provision claims a ready one "
            "instead of making a Pod.",
        ),
        [
            {"name": "Template", "type": "string", "jsonPath": ".spec.template", "description": "The PodTemplate."},
            {"name": "Size", "type": "integer", "jsonPath": ".spec.size", "description": "Ready Pods wanted."},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.ready",
             "description": "Warm Pods: running, checked, unclaimed, of the current template."},
            {"name": "Claimed", "type": "integer", "jsonPath": ".status.claimed",
             "description": "Pods of the pool claimed by a sandbox and not deleted yet."},
            {"name": "Total", "type": "integer", "jsonPath": ".status.total",
             "description": "Ready, starting and claimed Pods of the pool."},
            dict(_AGE),
        ],
        ["durable-sandbox"],
    )
    return [workflow, sandbox, journal, pool, schedule_crd()]


SCHEDULE_NAME_TOO_LONG = (f"a WorkflowSchedule's name is at most {NAME_MAX} characters: the Workflows it makes are named "
                          "<schedule>-<Unix time of the tick> and must fit a label value (63)")
ONE_TIMING = "set exactly one of schedule (cron) or every"
ZONE_NEEDS_CRON = "timeZone applies to a cron schedule, not to every"


def _template_rules(node: Any) -> Any:
    """The embedded Workflow spec's rules, made fit for a template: no transition rules (a template may change;
    the Workflows made from it are judged by their own CRD when they are made). The create-time item rules of
    hoist_item_rules stay: a template's calls are checked when the schedule is made, and by the operator (which
    loads every template through the models) at every tick."""
    if isinstance(node, list):
        return [_template_rules(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _template_rules(v) for k, v in node.items()}
    if VALIDATIONS in out:
        out[VALIDATIONS] = [r for r in out[VALIDATIONS] if r.get("optionalOldSelf") or "oldSelf" not in r["rule"]]
    return out


def schedule_crd() -> Schema:
    """The WorkflowSchedule CRD (kube/spec/schedule_models.py)."""
    schema = structural_schema(WorkflowScheduleResource, "Workflows made from a template on a cron schedule (in a "
                               "time zone) or every N, never twice for one tick (kube/schedule/).")
    spec = schema["properties"]["spec"]
    template = spec["properties"]["workflowTemplate"]
    template["properties"]["spec"] = _template_rules(template["properties"]["spec"])
    spec[VALIDATIONS] = [rule("has(self.schedule) != has(self.every)", ONE_TIMING),
                         rule("!has(self.timeZone) || has(self.schedule)", ZONE_NEEDS_CRON, fieldPath=".timeZone")]
    schema[VALIDATIONS] = [rule(f"size(self.metadata.name) <= {NAME_MAX}", SCHEDULE_NAME_TOO_LONG)]
    return _crd(
        "WorkflowSchedule",
        SCHEDULES,
        "dwfsched",
        schema,
        [
            {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule", "description": "The cron schedule."},
            {"name": "Every", "type": "string", "jsonPath": ".spec.every", "description": "Or the period."},
            {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend", "description": "Ticks passed over."},
            {"name": "Active", "type": "string", "jsonPath": ".status.active[*].name",
             "description": "Workflows it made that still run."},
            {"name": "Last", "type": "date", "jsonPath": ".status.lastScheduleTime", "description": "The last tick."},
            {"name": "Next", "type": "date", "jsonPath": ".status.nextScheduleTime", "description": "The next tick."},
            dict(_AGE),
        ],
        ["durable-sandbox"],
    )


# ------------------------------------------------------------------------------------------- admission policy

# Rules about free JSON (spec.input, the values of spec.signals): a CRD's CEL rules cannot see fields without a
# schema (x-kubernetes-preserve-unknown-fields), so these are a ValidatingAdmissionPolicy, whose CEL sees the
# object as plain JSON. It matches updates of the main resource only (not the status subresource, which the
# operator writes often), which is also why the toolCalls comparison is here (POLICY_COMPARED).
INPUT_IMMUTABLE = immutable_message("input")
SIGNALS_ONLY_GAIN = (
    "spec.signals can only gain keys: a signal, once given, can neither be removed nor changed "
    "(the run may already have acted on it)"
)
REPLAY_ANSWERS = (
    "spec.signals: a replay callback (replay:<op id>) is answered \"rerun\" or \"skip\": a signal cannot change "
    "once given, and the run could do nothing with another value"
)
POLICY_NAME = f"{WORKFLOWS}.{GROUP}"
POLICY_RULES: Final[Sequence[Mapping[str, str]]] = (
    *(
        {
            # The CRD refuses the field appearing or disappearing; here, a changed value.
            "expression": f"!has(object.spec.{field}) || !has(oldObject.spec.{field}) || "
            f"object.spec.{field} == oldObject.spec.{field}",
            "message": immutable_message(field),
            "reason": "Invalid",
        }
        for field in sorted(POLICY_COMPARED)
    ),
    {
        "expression": "has(object.spec.input) == has(oldObject.spec.input) && "
        "(!has(object.spec.input) || object.spec.input == oldObject.spec.input)",
        "message": INPUT_IMMUTABLE,
        "reason": "Invalid",
    },
    {
        "expression": "!has(oldObject.spec.signals) || (has(object.spec.signals) && oldObject.spec.signals.all("
        "k, k in object.spec.signals && object.spec.signals[k] == oldObject.spec.signals[k]))",
        "message": SIGNALS_ONLY_GAIN,
        "reason": "Invalid",
    },
    {
        # Only keys the update adds: a Workflow created with a wrong answer (the operator refuses that signal and
        # says so) must still take suspend and cancel.
        "expression": "!has(object.spec.signals) || object.spec.signals.all(k, !k.startsWith('replay:') || "
        "(has(oldObject.spec.signals) && k in oldObject.spec.signals) || "
        "object.spec.signals[k] == 'rerun' || object.spec.signals[k] == 'skip')",
        "message": REPLAY_ANSWERS,
        "reason": "Invalid",
    },
)


def generate_admission_policy() -> list[Schema]:
    """The ValidatingAdmissionPolicy for Workflow updates and its binding (Deny), in that order."""
    return _denying_policy(POLICY_NAME, ["UPDATE"], [WORKFLOWS], [dict(rule) for rule in POLICY_RULES])


def _denying_policy(name: str, operations: list[str], resources: list[str], validations: list[Schema],
                    match_conditions: list[Schema] | None = None) -> list[Schema]:
    """A ValidatingAdmissionPolicy on this group's ``resources`` and its binding that denies what it refuses."""
    spec: Schema = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": operations, "resources": resources}
            ]
        },
    }
    if match_conditions is not None:
        spec["matchConditions"] = match_conditions
    spec["validations"] = validations
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name}, "spec": spec}
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


# Who creates a fork must be allowed to read its source (issue 36, trust): the operator cannot know who created an
# object, admission can, and asks the API server's authorizer whether that user may get the source, by name, in the
# fork's namespace (the only one a fork reads). Checked on creation, and on an update that sets or changes the field
# (the CRD fixes it at creation already: this holds even if that rule is ever relaxed).
FORK_POLICY_NAME = f"forks.{GROUP}"
FORK_SOURCES: Final[Sequence[tuple[str, str, str, str]]] = (
    # (the fork's resource, its field, the field naming the source, the source's resource)
    (SANDBOXES, "from", "sandbox", SANDBOXES),
    (SANDBOXES, "from", "workflow", WORKFLOWS),
    (WORKFLOWS, "forkOf", "workflow", WORKFLOWS),
)


def fork_refused_message(field: str, source: str) -> str:
    kind = "Sandbox" if source == SANDBOXES else "Workflow"
    return (f"spec.{field}: refused, the requesting user may not get the source {kind} (a fork reads its source's "
            f"calls and workspace); grant it get on {source}.{GROUP} for that name in this namespace (a Role and "
            f"RoleBinding), or fork a {kind} it may read")


def _fork_changed(resource: str, field: str) -> str:
    return (f"(request.resource.resource == '{resource}' && has(object.spec) && has(object.spec.{field}) && "
            f"(request.operation == 'CREATE' || !has(oldObject.spec) || !has(oldObject.spec.{field}) || "
            f"oldObject.spec.{field} != object.spec.{field}))")


def generate_fork_policy() -> list[Schema]:
    """The ValidatingAdmissionPolicy that refuses a fork whose creator may not get its source, and its binding."""
    fields = sorted({(resource, field) for resource, field, _, _ in FORK_SOURCES})
    validations = [
        {
            "expression": f"request.resource.resource != '{resource}' || !has(object.spec.{field}) || "
            f"!has(object.spec.{field}.{name}) || authorizer.group('{GROUP}').resource('{source}')"
            f".namespace(request.namespace).name(object.spec.{field}.{name}).check('get').allowed()",
            "message": fork_refused_message(f"{field}.{name}", source),
            "reason": "Forbidden",
        }
        for resource, field, name, source in FORK_SOURCES
    ]
    return _denying_policy(
        FORK_POLICY_NAME, ["CREATE", "UPDATE"], sorted({resource for resource, _ in fields}), validations,
        [{"name": "sets-a-fork-source", "expression": " || ".join(_fork_changed(r, f) for r, f in fields)}])


def _check_coverage() -> None:
    """Every hand-written rule must land somewhere: a renamed model or field must not drop one silently."""
    used_rules: set[str] = set()
    used_extras: set[tuple[str, str]] = set()
    for model in (WorkflowResource, SandboxResource):
        converter = _Converter(model.model_json_schema(by_alias=True))
        props = model.model_json_schema(by_alias=True)["properties"]
        converter.convert(props["spec"])
        converter.convert(props["status"])
        used_rules |= converter.used_model_rules
        used_extras |= converter.used_field_extras
    missing = (set(MODEL_RULES) - used_rules) | {f"{m}.{f}" for m, f in (set(FIELD_EXTRAS) | set(HOISTED)) - used_extras}
    if missing:
        raise RuntimeError(f"CEL rules/extras for models or fields that no longer exist: {sorted(missing)}")


# ------------------------------------------------------------------------------------------- files


def render(*documents: Schema) -> str:
    return HEADER + yaml.safe_dump_all(documents, sort_keys=False, width=120, allow_unicode=True)


POLICY_FILE = f"{POLICY_NAME}.policy.yaml"
FORK_POLICY_FILE = f"{FORK_POLICY_NAME}.policy.yaml"


def rendered_files() -> dict[str, str]:
    """File name -> YAML text: every CRD, and the admission policy."""
    _check_coverage()
    files = {f"{crd['metadata']['name']}.yaml": render(crd) for crd in generate_crds()}
    files[POLICY_FILE] = render(*generate_admission_policy())
    files[FORK_POLICY_FILE] = render(*generate_fork_policy())
    return files


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered_files().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


def diff(directory: Path) -> str:
    """A unified diff from the files in ``directory`` to what the models generate ('' when up to date)."""
    out: list[str] = []
    for name, text in rendered_files().items():
        path = directory / name
        current = path.read_text() if path.exists() else ""
        if current != text:
            out.extend(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=str(path),
                    tofile=f"{path} (generated)",
                )
            )
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_sandbox.kube.spec.crds", description=(__doc__ or "").split("\n\n")[0]
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="DIR", type=Path, help="write the CRD YAML files into DIR")
    group.add_argument(
        "--check", metavar="DIR", type=Path, help="exit 1 with a diff when DIR's files are stale"
    )
    args = parser.parse_args(argv)
    if args.write is not None:
        for path in write(args.write):
            print(path)
        return 0
    stale = diff(args.check)
    if stale:
        sys.stdout.write(stale)
        print(f"CRDs in {args.check} are stale; regenerate with: {REGENERATE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

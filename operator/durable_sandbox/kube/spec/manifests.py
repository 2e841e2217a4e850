"""Loading multi-document manifest YAML into resource models, with errors a person can act on.

Every problem in a file is reported at once, each as
``<file>: document <N> <Kind>/<name>: <field.path[i]>: <reason>``, with the field path spelled as it
is in the manifest (camelCase aliases, ``[i]`` for list indexes), so a user can find it without
knowing anything about pydantic.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel, ValidationError

from durable_sandbox.engine.inputs import format_loc
from durable_sandbox.kube.api.resources import API_VERSION
from durable_sandbox.kube.spec.models import (
    KINDS,
    SandboxResource,
    WorkflowResource,
)
from durable_sandbox.workflows.sandbox_agent import ENV_NAME_PATTERN, NO_NUL_PATTERN

_TOOL_TYPES = ("shell", "write_file", "read_file")

# What a pattern means, for the patterns whose regex would tell a manifest author nothing.
_PATTERN_MEANINGS: Final[Mapping[str, str]] = {
    ENV_NAME_PATTERN: "is not an environment variable name (letters, digits and '_', not starting with a digit)",
    NO_NUL_PATTERN: "contains a NUL character, which no environment value can hold",
}


class ManifestError(ValueError):
    """A manifest could not be loaded; ``problems`` holds one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@functools.cache
def _vocabulary() -> tuple[str, ...]:
    """Every field name (alias) of the resource models, sorted, for "did you mean" hints (gathered once)."""
    return tuple(sorted(_field_vocabulary()))


def _field_vocabulary() -> set[str]:
    """Every field name (alias) of the resource models."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            names.add(field.alias or name)
            for sub in _models_in(field.annotation):
                walk(sub)

    for resource in KINDS.values():
        walk(resource)
    return names


def _models_in(annotation: Any) -> Iterable[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _models_in(arg)
    origin = getattr(annotation, "__origin__", None)
    if origin is not None and getattr(annotation, "__metadata__", None) is not None:
        yield from _models_in(origin)


def _suggest(name: str) -> str:
    match = difflib.get_close_matches(name, _vocabulary(), n=1, cutoff=0.75)
    return f"; did you mean {match[0]!r}?" if match else ""


def _clean_loc(loc: Sequence[int | str]) -> list[int | str]:
    # Pydantic puts the discriminator's value into the location of a tagged union member
    # (toolCalls.2.shell.command); the manifest has no such level, so drop it.
    out: list[int | str] = []
    for i, part in enumerate(loc):
        if part in _TOOL_TYPES and i > 0 and isinstance(loc[i - 1], int):
            continue
        out.append(part)
    return out


def describe_error(err: Any) -> tuple[str, str]:
    """(field path, reason) for one pydantic error dict, phrased for manifest authors."""
    loc = _clean_loc(err.get("loc", ()))
    ctx = err.get("ctx") or {}
    etype = err.get("type", "")
    msg = str(err.get("msg", ""))
    loc.extend(ctx.get("subloc", []))
    if etype == "value_error":
        msg = msg.removeprefix("Value error, ")
        inp = err.get("input")
        # The tool-call models check paths in a model validator, which locates the error at the call;
        # point at the offending field instead.
        if isinstance(inp, dict) and msg.startswith("unsafe path"):
            for key in ("path", "cwd"):
                if key in inp and repr(inp[key]) in msg:
                    loc.append(key)
                    break
    elif etype == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        msg = f"unknown field {name!r}{_suggest(name)}"
    elif etype == "union_tag_invalid":
        loc.append("type")
        msg = f"unknown tool type {ctx.get('tag')!r}; expected one of {', '.join(_TOOL_TYPES)}"
    elif etype == "union_tag_not_found":
        loc.append("type")
        msg = f"Field required (one of {', '.join(_TOOL_TYPES)})"
    elif etype == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_MEANINGS:
        pattern = ctx["pattern"]
        subject = repr(err.get("input"))
        if loc and loc[-1] == "[key]":  # a mapping's key: point at the mapping, name the key in the reason
            loc = loc[:-2]
        elif pattern == NO_NUL_PATTERN:
            subject = "the value"  # it may be a secret: never echo it
        msg = f"{subject} {_PATTERN_MEANINGS[pattern]}"
    elif etype == "literal_error" and loc and loc[-1] in ("apiVersion", "kind"):
        msg = f"expected {ctx.get('expected')}, got {err.get('input')!r}"
    return format_loc(loc), msg


def validation_problems(exc: ValidationError, prefix: str) -> list[str]:
    problems = []
    for err in exc.errors():
        path, reason = describe_error(err)
        problems.append(f"{prefix}{path}: {reason}" if path else f"{prefix}{reason}")
    return problems


def _source(path_or_text: str | os.PathLike[str]) -> tuple[str, str]:
    if isinstance(path_or_text, os.PathLike):
        path = Path(path_or_text)
    elif "\n" not in path_or_text and path_or_text.strip() and Path(path_or_text).is_file():
        path = Path(path_or_text)
    else:
        return "<manifest>", str(path_or_text)
    try:
        return str(path), path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise ManifestError([f"{path}: not UTF-8 text: {exc}"]) from exc


# Bounds on what a manifest may be, checked while loading and before anything is built from it.
# kube-apiserver refuses request bodies over 3 MiB (and etcd objects over 1.5 MiB), so no manifest
# that could ever be applied is larger; a valid 10,000-call Workflow is about 120,000 YAML nodes.
MAX_MANIFEST_BYTES = 3 * 1024 * 1024
MAX_EXPANDED_NODES = 250_000  # per document, counting every alias at its expanded size
MAX_DEPTH = 100  # nesting of mappings and sequences, the same bound as --input's JSON


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader, refusing a key given twice in one mapping: such a manifest says two things and
    only one can be meant. (kubectl 1.37 silently keeps the last one; the API server's strict field
    validation refuses duplicate fields only in a JSON body.) A key merged with ``<<`` may still be
    overridden, as YAML's merge semantics say."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: SafeConstructor reports it
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} in a mapping (first given at line {first.start_mark.line + 1}); "
                    f"each key may appear once",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


@dataclass
class _Extent:
    nodes: int = 0  # YAML nodes
    chars: int = 0  # characters of scalars (keys included)
    depth: int = 0  # nesting of mappings and sequences


def _expanded_extent(root: yaml.Node) -> _Extent:
    """How big a document is with every alias expanded, computed on the node graph (where an alias is
    a shared node) without expanding it: an alias bomb of a few hundred bytes is measured in
    microseconds instead of being built into gigabytes. Stops early once a bound is passed."""
    done: dict[int, _Extent] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in done:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in done)
            continue
        parts = [done[id(c)] for c in children]
        extent = _Extent(
            nodes=1 + sum(p.nodes for p in parts),
            chars=(len(node.value) if isinstance(node, yaml.ScalarNode) else 0) + sum(p.chars for p in parts),
            depth=(1 + max((p.depth for p in parts), default=0)) if children or not isinstance(node, yaml.ScalarNode) else 0,
        )
        done[id(node)] = extent
        if extent.nodes > MAX_EXPANDED_NODES or extent.chars > MAX_MANIFEST_BYTES or extent.depth > MAX_DEPTH:
            return extent
    return done[id(root)]


def _check_extent(name: str, index: int, node: yaml.Node) -> None:
    extent = _expanded_extent(node)
    where = f"{name}: document {index}: "
    if extent.depth > MAX_DEPTH:
        raise ManifestError([f"{where}nested more than {MAX_DEPTH} levels deep"])
    if extent.nodes > MAX_EXPANDED_NODES or extent.chars > MAX_MANIFEST_BYTES:
        what = (
            f"more than {MAX_EXPANDED_NODES} YAML nodes"
            if extent.nodes > MAX_EXPANDED_NODES
            else f"more than {MAX_MANIFEST_BYTES} bytes"
        )
        raise ManifestError(
            [f"{where}expands to {what} once its aliases (*name) are replaced by what they repeat; refused "
             f"before loading it (kubectl sends the expanded document, and the API server refuses requests "
             f"over {MAX_MANIFEST_BYTES} bytes). Use fewer aliases, or keep large data out of the manifest"]
        )


def _yaml_problem(name: str, exc: yaml.YAMLError) -> ManifestError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return ManifestError([f"{name}: invalid YAML: {where}{problem}"])


def _documents(name: str, text: str) -> list[tuple[int, Any]]:
    """Every document of ``text``, refusing (before building any of it) what no cluster would accept:
    more than MAX_MANIFEST_BYTES, aliases expanding past MAX_EXPANDED_NODES, nesting deeper than
    MAX_DEPTH, and duplicate mapping keys."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_MANIFEST_BYTES:
        raise ManifestError(
            [f"{name}: {size} bytes is larger than a manifest may be ({MAX_MANIFEST_BYTES} bytes, the API "
             f"server's request limit); keep large data out of the manifest"]
        )
    raw: list[Any] = []
    loader = _StrictLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            _check_extent(name, len(raw) + 1, node)
            raw.append(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise _yaml_problem(name, exc) from exc
    except RecursionError:
        # The YAML composer recurses once per nesting level: deeper than Python allows is far past MAX_DEPTH.
        raise ManifestError([f"{name}: nested more than {MAX_DEPTH} levels deep"]) from None
    finally:
        loader.dispose()
    return [(i, doc) for i, doc in enumerate(raw, start=1) if doc is not None]


def load_manifests(
    path_or_text: str | os.PathLike[str], *, source: str | None = None
) -> list[WorkflowResource | SandboxResource]:
    """Parse every document of a manifest file (or YAML text) into Workflow/Sandbox models.

    Raises :class:`ManifestError` listing every problem in every document.
    """
    name, text = _source(path_or_text)
    name = source or name
    docs = _documents(name, text)
    if not docs:
        raise ManifestError([f"{name}: no documents; expected a Workflow (and optionally Sandbox) manifest"])
    problems: list[str] = []
    resources: list[WorkflowResource | SandboxResource] = []
    for index, doc in docs:
        where = f"{name}: document {index}"
        if not isinstance(doc, dict):
            problems.append(f"{where}: expected a mapping with apiVersion, kind, metadata and spec, got {type(doc).__name__}")
            continue
        kind = doc.get("kind")
        meta = doc.get("metadata")
        obj_name = meta.get("name") if isinstance(meta, dict) else None
        label = f"{where} {kind if isinstance(kind, str) else '?'}/{obj_name or '<unnamed>'}: "
        if kind is None:
            problems.append(f"{label}kind: Field required (Workflow or Sandbox)")
            continue
        model = KINDS.get(kind) if isinstance(kind, str) else None
        if model is None:
            problems.append(f"{label}kind: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
            continue
        if doc.get("apiVersion") != API_VERSION:
            # Checked before the model so a manifest for another API is not reported field by field.
            problems.append(f"{label}apiVersion: expected {API_VERSION!r}, got {doc.get('apiVersion')!r}")
            continue
        try:
            resources.append(model.model_validate(doc))
        except ValidationError as exc:
            problems.extend(validation_problems(exc, label))
    if problems:
        raise ManifestError(problems)
    return resources


__all__ = ["ManifestError", "describe_error", "format_loc", "load_manifests", "validation_problems"]

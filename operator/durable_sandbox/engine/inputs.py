"""A workflow's input, checked against its input parameter's annotation, and how a mismatch reads.

Every annotation is checked (``str``, ``int``, ``dict``, ``list[int]``, ``int | None``, a pydantic model...)
with a pydantic ``TypeAdapter`` in pydantic's default (lax) mode, the mode a model's fields already had:
``"5"`` is accepted for ``int`` (and handed to the workflow as ``5``), ``"abc"`` or an object is not.
Only an unannotated parameter (or ``Any``, ``object``) takes anything. Every place an input enters
(`dsb run`, `--dry-run`, a manifest's ``spec.input``, the operator's admission, ``Engine.create``)
goes through :meth:`WorkflowDefinition.prepare_input`, so they all refuse the same inputs the same way.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_type_hints

from pydantic import TypeAdapter, ValidationError

_GIVEN_CHARS = 80  # how much of a given value a message quotes


@dataclass(frozen=True)
class InputParameter:
    """The workflow's input parameter: how messages name it (``who: str``) and what checks a value."""

    label: str
    adapter: TypeAdapter[Any] | None  # None: not annotated (or Any): anything is accepted


def input_parameter(fn: Callable[..., Any], param: inspect.Parameter) -> InputParameter:
    try:
        ann = get_type_hints(fn).get(param.name)
    except Exception:  # an annotation that does not evaluate here (a forward reference): nothing to check with
        ann = None
    if ann in (None, Any, object):
        return InputParameter(param.name, None)
    return InputParameter(f"{param.name}: {type_name(ann)}", TypeAdapter(ann))


def type_name(ann: Any) -> str:
    """``str``, ``int | None``, ``dict[str, int]``, ``Params``: the annotation as its source reads."""
    if isinstance(ann, type) and not get_args(ann):
        return ann.__qualname__
    # typing's reprs qualify every name (typing.Optional[tests.flows.Params]); the source does not.
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*)", "", repr(ann))


def format_loc(loc: Sequence[int | str]) -> str:
    """``spec.input.items[2].name``: a place in a document, from pydantic's location tuple."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def describe_mismatch(exc: ValidationError, raw: Any, parameter: str, root: str = "input") -> str:
    """One line: each problem's place in the input (``input.name``), what was expected there and what was
    given, then the parameter the input is checked against: ``input: Input should be a valid string,
    given {"who": "Ada"} (parameter `who: str`)``."""
    places: dict[str, tuple[list[str], str]] = {}  # place -> (what each union member expected, what was given)
    for err in exc.errors(include_url=False):
        place = format_loc([root, *_input_path(raw, err.get("loc", ()), err.get("type", ""))])
        given = "" if err.get("type") == "missing" else f", given {_show(err.get('input'))}"
        expected, _ = places.setdefault(place, ([], given))
        if err.get("msg") not in expected:
            expected.append(str(err.get("msg")))
    problems = [f"{place}: {', or '.join(expected)}{given}" for place, (expected, given) in places.items()]
    return f"{'; '.join(problems)} (parameter `{parameter}`)"


def _input_path(raw: Any, loc: Sequence[int | str], kind: str) -> list[int | str]:
    """The part of pydantic's location that is a place in the value: without the names pydantic gives the
    members of a union (``int``, ``str``, ``function-after[...]``), which the input has no level for."""
    path: list[int | str] = []
    here: Any = raw
    for i, part in enumerate(loc):
        if isinstance(here, dict) and part in here:
            here = here[part]
        elif isinstance(here, list) and isinstance(part, int) and -len(here) <= part < len(here):
            here = here[part]
        elif not (i == len(loc) - 1 and kind == "missing"):  # a required key is missing: that is a place
            continue
        path.append(part)
    return path


def _show(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= _GIVEN_CHARS else text[: _GIVEN_CHARS - 1] + "…"


__all__ = ["InputParameter", "describe_mismatch", "format_loc", "input_parameter", "type_name"]

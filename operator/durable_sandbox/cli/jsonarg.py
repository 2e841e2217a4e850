"""Parsing JSON given on the command line or in a file."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from durable_sandbox.kube.spec.manifests import MAX_DEPTH
from durable_sandbox.runs.errors import CliError


def nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (iteratively: the value may be hostile)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json(text: str, what: str, *, flag: str | None = None) -> Any:
    """``text`` as JSON. ``flag`` says the text came from the command line and how (``"--input "``, ``""`` for
    an argument), so the hint for a bare word is a shell word; None: from a file, the hint is JSON."""
    too_deep = CliError(f"{what} nests lists/objects more than {MAX_DEPTH} levels deep; flatten it")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                       f"{_string_hint(text, flag)}") from exc
    except RecursionError:
        raise too_deep from None
    if nesting_depth(value) > MAX_DEPTH:
        raise too_deep
    return value


def _string_hint(text: str, flag: str | None) -> str:
    """How to pass ``text`` as a JSON string, when it looks like a bare word meant as one (`--input Ada`)."""
    bare = text.strip()
    if not bare or bare[0] in "{[\"'":
        return ""  # malformed JSON, not a string without quotes
    quoted = json.dumps(bare, ensure_ascii=False)
    return f"; a string needs JSON's double quotes: {quoted if flag is None else flag + shlex.quote(quoted)}"


def read_input(inline: str | None, path: str | None) -> tuple[bool, Any]:
    """(given, value) from --input / --input-file ('-' reads stdin)."""
    if inline is not None and path is not None:
        raise CliError("give --input or --input-file, not both")
    if inline is not None:
        return True, parse_json(inline, "--input", flag="--input ")
    if path is not None:
        if path == "-":
            return True, parse_json(sys.stdin.read(), "--input-file -")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read --input-file {path}: {exc.strerror or exc}") from exc
        return True, parse_json(text, f"--input-file {path}")
    return False, None

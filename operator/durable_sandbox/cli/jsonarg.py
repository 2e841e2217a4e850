"""Parsing JSON given on the command line or in a file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from durable_sandbox.cli.errors import CliError
from durable_sandbox.kube.manifests import MAX_DEPTH


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


def parse_json(text: str, what: str) -> Any:
    too_deep = CliError(f"{what} nests lists/objects more than {MAX_DEPTH} levels deep; flatten it")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError:
        raise too_deep from None
    if nesting_depth(value) > MAX_DEPTH:
        raise too_deep
    return value


def read_input(inline: str | None, path: str | None) -> tuple[bool, Any]:
    """(given, value) from --input / --input-file ('-' reads stdin)."""
    if inline is not None and path is not None:
        raise CliError("give --input or --input-file, not both")
    if inline is not None:
        return True, parse_json(inline, "--input")
    if path is not None:
        if path == "-":
            return True, parse_json(sys.stdin.read(), "--input-file -")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read --input-file {path}: {exc.strerror or exc}") from exc
        return True, parse_json(text, f"--input-file {path}")
    return False, None

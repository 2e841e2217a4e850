"""Parsing JSON given on the command line or in a file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from durable_sandbox.cli.errors import CliError


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc


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

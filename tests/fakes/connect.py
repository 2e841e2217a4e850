"""Connect protocol envelopes as the fake E2B envd writes and reads them.

Deliberately independent of the adapter's own codec: if both shared one implementation, a bug in it would
be invisible to the tests that are meant to catch protocol drift.
"""

from __future__ import annotations

import json
import struct
from typing import Any

FLAG_DATA = 0x00
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
HEADER = struct.Struct(">BI")


def envelope(payload: dict[str, Any], *, flags: int = FLAG_DATA) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return HEADER.pack(flags, len(body)) + body


def raw_envelope(body: bytes, *, flags: int = FLAG_DATA, declared_length: int | None = None) -> bytes:
    """An envelope whose header may lie about its length (used to produce truncated streams)."""
    length = len(body) if declared_length is None else declared_length
    return HEADER.pack(flags, length) + body


def decode_single_request(body: bytes) -> dict[str, Any]:
    """Parse a unary-in request body: exactly one uncompressed data envelope holding a JSON object."""
    if len(body) < HEADER.size:
        raise ValueError(f"request body is {len(body)} bytes; a Connect envelope needs a 5-byte header")
    flags, length = HEADER.unpack_from(body)
    if flags != FLAG_DATA:
        raise ValueError(f"request envelope flags must be 0x00 (uncompressed data), got 0x{flags:02x}")
    if len(body) != HEADER.size + length:
        raise ValueError(
            f"request body must be exactly one envelope: header says {length} bytes, body carries {len(body) - HEADER.size}"
        )
    try:
        payload = json.loads(body[HEADER.size :])
    except ValueError as exc:
        raise ValueError(f"request envelope is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise ValueError("request envelope must hold a JSON object")
    return payload

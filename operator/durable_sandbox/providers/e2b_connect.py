"""Strict reader for the Connect server stream of envd's ``process.Process/Start``.

Envelope: 1 flag byte (0x00 data, 0x01 compressed, 0x02 end-of-stream) + 4-byte big-endian length + JSON.
Anything the protocol does not allow is an error with a clear message: a tool result is only ever built from
a stream that reported how the process ended, so nothing is fabricated from a broken one.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.providers.contract import ProviderError

FLAG_DATA = 0x00
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
_HEADER = struct.Struct(">BI")
# envd's events are small; a bigger frame means a desynchronised stream, not a big output chunk.
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024
_EVENT_KINDS = frozenset({"start", "data", "end", "keepalive"})
# Connect error codes that say retrying the same request cannot help.
_PERMANENT_CODES = frozenset(
    {"invalid_argument", "not_found", "permission_denied", "unauthenticated", "unimplemented", "failed_precondition"}
)


class ConnectProtocolError(ProviderError):
    """The stream broke the Connect protocol (or envd's event schema); retrying the same call will not fix it."""

    retryable = False


class ConnectStreamError(ProviderError):
    """The stream ended with an end-of-stream error from envd."""

    def __init__(self, code: str, message: str, partial: ProcessOutcome | None = None, *, context: str = "") -> None:
        self.code = code
        self.server_message = message
        self.retryable = code not in _PERMANENT_CODES
        self.partial = partial  # output received before the error (a deadline still reports what ran)
        prefix = f"{context}: " if context else ""
        super().__init__(f"{prefix}envd ended the process stream with error [{code}]: {message}")


class ConnectStreamTruncated(ProviderError):
    """The connection ended before the end-of-stream envelope: the process may or may not have finished."""


def encode_envelope(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return _HEADER.pack(FLAG_DATA, len(body)) + body


@dataclass
class ProcessOutcome:
    exit_code: int | None = None
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    pid: int | None = None
    end_error: str | None = None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConnectProtocolError(f"malformed Connect {what} envelope: payload is not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ConnectProtocolError(f"malformed Connect {what} envelope: payload is {type(value).__name__}, not an object")
    return value


def _b64(value: Any, key: str) -> bytes:
    if not isinstance(value, str):
        raise ConnectProtocolError(f"malformed process data event: {key} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ConnectProtocolError(f"malformed process data event: {key} is not valid base64 ({exc})") from exc


def _apply_event(outcome: ProcessOutcome, payload: dict[str, Any]) -> None:
    event = payload.get("event")
    if not isinstance(event, dict) or len(event) != 1:
        raise ConnectProtocolError(f"malformed process event: expected {{'event': {{<one kind>: ...}}}}, got keys {sorted(payload)}")
    ((kind, body),) = event.items()
    if kind not in _EVENT_KINDS or not isinstance(body, dict):
        raise ConnectProtocolError(f"unknown process event [{kind}]: expected one of {sorted(_EVENT_KINDS)}")
    if outcome.exit_code is not None and kind != "keepalive":
        raise ConnectProtocolError(f"process event [{kind}] arrived after the end event")
    if kind == "start":
        pid = body.get("pid")
        outcome.pid = pid if isinstance(pid, int) else None
    elif kind == "data":
        for key, value in body.items():
            if key == "stderr":
                outcome.stderr += _b64(value, key)
            elif key in ("stdout", "pty"):  # a pty merges both streams; it can only be reported as stdout
                outcome.stdout += _b64(value, key)
            else:
                raise ConnectProtocolError(f"malformed process data event: unknown field [{key}]")
    elif kind == "end":
        code = body.get("exitCode", 0)  # proto3 JSON omits a zero exit code
        if not isinstance(code, int) or isinstance(code, bool):
            raise ConnectProtocolError(f"malformed process end event: exitCode is {code!r}")
        outcome.exit_code = code
        error = body.get("error")
        outcome.end_error = error if isinstance(error, str) and error else None


async def read_process_stream(chunks: AsyncIterator[bytes]) -> ProcessOutcome:
    """Consume a whole ``process.Process/Start`` response body and return how the process ended."""
    outcome = ProcessOutcome()
    buffer = bytearray()
    finished = False
    async for chunk in chunks:
        buffer += chunk
        while not finished and len(buffer) >= _HEADER.size:
            flags, length = _HEADER.unpack_from(buffer)
            if flags & FLAG_COMPRESSED:
                raise ConnectProtocolError(
                    "Connect stream sent a compressed frame, but no compression was negotiated; refusing to guess its content"
                )
            if flags not in (FLAG_DATA, FLAG_END_STREAM):
                raise ConnectProtocolError(f"malformed Connect envelope: unknown flags 0x{flags:02x}")
            if length > MAX_ENVELOPE_BYTES:
                raise ConnectProtocolError(f"malformed Connect envelope: declared length {length} exceeds {MAX_ENVELOPE_BYTES}")
            if len(buffer) < _HEADER.size + length:
                break
            raw = bytes(buffer[_HEADER.size : _HEADER.size + length])
            del buffer[: _HEADER.size + length]
            if flags == FLAG_END_STREAM:
                _end_of_stream(_json_object(raw, "end-of-stream"), outcome)
                finished = True
            else:
                _apply_event(outcome, _json_object(raw, "data"))
        if finished and buffer:
            raise ConnectProtocolError(f"Connect stream carried {len(buffer)} byte(s) after its end-of-stream envelope")
    if not finished:
        detail = f" ({len(buffer)} byte(s) of an incomplete envelope)" if buffer else ""
        raise ConnectStreamTruncated(
            f"Connect stream ended before its end-of-stream envelope{detail}; the command may or may not have finished"
        )
    if outcome.exit_code is None:
        raise ConnectProtocolError("Connect stream finished without a process end event; the exit code is unknown")
    return outcome


def _end_of_stream(payload: dict[str, Any], outcome: ProcessOutcome) -> None:
    error = payload.get("error")
    if error is None:
        return
    if not isinstance(error, dict):
        raise ConnectProtocolError("malformed Connect end-of-stream envelope: error must be an object")
    code = error.get("code", "unknown")
    message = error.get("message", "")
    raise ConnectStreamError(str(code), str(message), outcome)

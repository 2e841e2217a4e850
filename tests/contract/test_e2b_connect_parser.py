"""The adapter's Connect stream reader, fed byte streams directly (cases the fake cannot easily produce)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator

import pytest

from durable_sandbox.providers.e2b_connect import (
    ConnectProtocolError,
    ConnectStreamError,
    ConnectStreamTruncated,
    ProcessOutcome,
    read_process_stream,
)


def env(payload: object, flags: int = 0) -> bytes:
    raw = json.dumps(payload).encode()
    return struct.pack(">BI", flags, len(raw)) + raw


def data(**streams: bytes) -> bytes:
    return env({"event": {"data": {k: base64.b64encode(v).decode() for k, v in streams.items()}}})


END_OK = env({"event": {"end": {"exited": True, "status": "exit status 0"}}})
EOS = env({}, flags=2)


async def feed(body: bytes, chunk: int = 1_000_000) -> ProcessOutcome:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), chunk):
            yield body[i : i + chunk]

    return await read_process_stream(chunks())


@pytest.mark.parametrize("chunk", [1, 3, 7, 1_000_000])
async def test_envelopes_split_across_chunks(chunk: int) -> None:
    body = env({"event": {"start": {"pid": 7}}}) + data(stdout=b"out") + data(stderr=b"err", pty=b"!") + END_OK + EOS
    outcome = await feed(body, chunk)
    assert (outcome.exit_code, bytes(outcome.stdout), bytes(outcome.stderr), outcome.pid) == (0, b"out!", b"err", 7)


async def test_exit_code_is_reported() -> None:
    outcome = await feed(env({"event": {"end": {"exitCode": 3, "exited": True}}}) + EOS)
    assert outcome.exit_code == 3


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (END_OK + EOS + b"\x00", ConnectProtocolError, "after its end-of-stream envelope"),
        (b"\x04\x00\x00\x00\x02{}", ConnectProtocolError, "unknown flags 0x04"),
        (b"\x00\xff\xff\xff\xff", ConnectProtocolError, "declared length"),
        (END_OK + data(stdout=b"late") + EOS, ConnectProtocolError, r"process event \[data\] arrived after the end event"),
        (env({"event": {"data": {"stdout": "not base64!"}}}), ConnectProtocolError, "not valid base64"),
        (env({"event": {"end": {"exitCode": "1"}}}) + EOS, ConnectProtocolError, "exitCode is '1'"),
        (env([1, 2]), ConnectProtocolError, "payload is list, not an object"),
        (END_OK + env({"error": "x"}, flags=2), ConnectProtocolError, "error must be an object"),
        (END_OK, ConnectStreamTruncated, "ended before its end-of-stream envelope"),
        (END_OK[:4], ConnectStreamTruncated, r"\(4 byte\(s\) of an incomplete envelope\)"),
        (b"", ConnectStreamTruncated, "ended before its end-of-stream envelope"),
        (END_OK + env({"error": {"code": "aborted", "message": "m"}}, flags=2), ConnectStreamError, r"\[aborted\]: m"),
    ],
)
async def test_protocol_violations(body: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        await feed(body)


async def test_keepalive_after_end_is_tolerated() -> None:
    outcome = await feed(END_OK + env({"event": {"keepalive": {}}}) + EOS)
    assert outcome.exit_code == 0

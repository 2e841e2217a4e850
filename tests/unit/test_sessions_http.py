"""The call API over HTTP (sessions/http.py): the routes, the JSON refusals (what, where, do), the request-size
bound, and the token never in an answer or the log."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from durable_sandbox.sessions.http import create_app
from durable_sandbox.sessions.models import Limits
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import local_gate, service

URL = "http://sessions/v1/namespaces/demo/sandboxes/box"
AUTH = {"Authorization": "Bearer good-token"}


async def client(tmp_path: Path, limits: Limits | None = None) -> httpx.AsyncClient:
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"), limits=limits)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(svc)), base_url="http://sessions")


async def test_the_calls_over_http(tmp_path: Path) -> None:
    async with await client(tmp_path) as http:
        wrote = await http.post(f"{URL}/write_file", headers=AUTH,
                                json={"operationId": "w1", "path": "dir/a.txt", "contents": "hello\n"})
        read = await http.post(f"{URL}/read_file", headers=AUTH, json={"operationId": "r1", "path": "dir/a.txt"})
        listed = await http.post(f"{URL}/list", headers=AUTH, json={"operationId": "l1", "path": "dir"})
        ran = await http.post(f"{URL}/shell", headers=AUTH,
                              json={"operationId": "s1", "command": "echo $GREETING; pwd", "cwd": "dir",
                                    "env": {"GREETING": "hi"}, "timeout": 30})
    assert wrote.status_code == 200 and wrote.json()["exitCode"] == 0
    assert read.json()["stdout"] == "hello\n"
    assert listed.json()["stdout"].splitlines() == ["a.txt"]
    assert ran.json()["stdout"].splitlines()[0] == "hi" and ran.json()["stdout"].rstrip().endswith("/dir")


@pytest.mark.parametrize(("kind", "body", "headers", "status", "where"), [
    ("shell", {"operationId": "s1", "command": "true"}, {}, 401, "header"),
    ("shell", {"operationId": "s1", "command": "true"}, {"Authorization": "Bearer other-token"}, 403, "Sandbox demo/box"),
    ("shell", {"operationId": "s1"}, AUTH, 400, "Sandbox demo/box, shell"),
    ("shell", {"operationId": "bad id!", "command": "true"}, AUTH, 400, "Sandbox demo/box, shell"),
    ("shell", {"operationId": "s1", "command": "true", "extra": 1}, AUTH, 400, "Sandbox demo/box, shell"),
    ("format_disk", {"operationId": "s1"}, AUTH, 404, "the URL's last segment"),
])
async def test_every_refusal_says_what_where_and_what_to_do(tmp_path: Path, kind: str, body: dict[str, object],
                                                           headers: dict[str, str], status: int, where: str) -> None:
    async with await client(tmp_path) as http:
        answer = await http.post(f"{URL}/{kind}", headers=headers, json=body)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["status"] == status and error["what"] and error["do"] and where in error["where"]


async def test_a_request_over_the_size_bound_is_refused_with_413(tmp_path: Path) -> None:
    async with await client(tmp_path, Limits(max_request_bytes=2048)) as http:
        answer = await http.post(f"{URL}/write_file", headers=AUTH,
                                 json={"operationId": "w1", "path": "big.txt", "contents": "x" * 4096})
        small = await http.post(f"{URL}/write_file", headers=AUTH,
                                json={"operationId": "w2", "path": "small.txt", "contents": "x" * 100})
    assert answer.status_code == 413 and "2048 bytes" in answer.json()["error"]["what"]
    assert small.status_code == 200


async def test_the_token_is_in_no_answer_and_no_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with await client(tmp_path) as http:
        ok = await http.post(f"{URL}/shell", headers=AUTH, json={"operationId": "s1", "command": "echo done"})
        refused = await http.post(f"{URL}/shell", headers={"Authorization": "Bearer other-token"},
                                  json={"operationId": "s2", "command": "echo no"})
    assert ok.status_code == 200 and refused.status_code == 403
    assert "call s1 (shell) by alice" in caplog.text
    for text in (ok.text, refused.text, caplog.text):
        assert "good-token" not in text and "other-token" not in text


async def test_an_unexpected_failure_is_a_json_error_saying_what_failed(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")

    async def broken_find(namespace: str, name: str) -> object:
        raise RuntimeError("the record could not be read")

    gate.find = broken_find  # type: ignore[method-assign,assignment]
    app = create_app(service(SqliteStore(tmp_path / "runs.db"), gate))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sessions") as http:
        answer = await http.post(f"{URL}/shell", headers=AUTH, json={"operationId": "s1", "command": "true"})
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert error["what"] == "the call failed: RuntimeError: the record could not be read"
    assert error["where"] == "Sandbox demo/box" and "same operationId" in error["do"] and not error["retry"]

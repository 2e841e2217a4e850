"""The provider contract kit's cases of the tool types: shell, write_file, read_file (``providers/testing.py``)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from durable_sandbox.providers.contract import (
    Capability,
    SandboxProvider,
)
from durable_sandbox.providers.kit_base import ContractResources, ProviderKit
from durable_sandbox.providers.streaming import Stream, streaming_to

__all__ = ["ToolCases"]


class ToolCases(ProviderKit):
    """shell, write_file and read_file as contract v1 states them; sandboxes are separate; the spec's env reaches
    commands but never the handle; a provider with ``output_streaming`` streams a shell call's output."""

    async def test_shell_reports_exit_code_stdout_and_stderr(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        assert (await kit.run(handle, "shell", command="echo hello")).outcome == (0, "hello\n", "")
        result = await kit.run(handle, "shell", command="printf out; printf err >&2; exit 3")
        assert result.outcome == (3, "out", "err"), "a nonzero exit is a result, not an exception"

    async def test_write_file_then_read_file_and_shell_see_it(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        written = await kit.run(handle, "write_file", path="dir/sub/note.txt", contents="héllo\n")
        assert written.outcome == (0, "wrote dir/sub/note.txt 7 bytes", ""), "size counts UTF-8 bytes"
        assert (await kit.run(handle, "read_file", path="dir/sub/note.txt")).outcome == (0, "héllo\n", "")
        assert (await kit.run(handle, "shell", command="cat dir/sub/note.txt")).outcome == (0, "héllo\n", "")
        await kit.run(handle, "write_file", path="dir/sub/note.txt", contents="v2")
        assert (await kit.run(handle, "read_file", path="dir/sub/note.txt")).outcome == (0, "v2", ""), "overwrites"

    async def test_read_missing_file_is_a_failed_result(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        result = await kit.run(handle, "read_file", path="missing.txt")
        assert result.outcome == (1, "", "File not found: missing.txt")

    async def test_unknown_tool_type_is_a_failed_result(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        result = await kit.run(handle, "teleport", destination="mars")
        assert result.outcome == (1, "", "Unsupported tool type: teleport")

    async def test_shell_cwd_and_env(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="sub/a.txt", contents="x")
        result = await kit.run(handle, "shell", command='cat a.txt; printf %s "$GREETING"', cwd="sub",
                               env={"GREETING": "hi"})
        assert result.outcome == (0, "xhi", "")

    async def test_sandboxes_are_separate(self, kit: ContractResources) -> None:
        first, second = await kit.provision(), await kit.provision()
        assert first.id != second.id
        await kit.run(first, "write_file", path="only-here.txt", contents="1")
        assert (await kit.run(second, "read_file", path="only-here.txt")).exit_code == 1

    async def test_spec_env_reaches_commands_but_not_the_handle(self, provider: SandboxProvider,
                                                                kit: ContractResources) -> None:
        secret = "kit-secret-" + uuid.uuid4().hex
        handle = await kit.provision(env={"KIT_SECRET": secret})
        assert handle.provider == provider.name
        for text in (handle.model_dump_json(), repr(handle), str(handle.metadata)):
            assert secret not in text, "handles are persisted in journals: they must never hold secrets"
        assert (await kit.run(handle, "shell", command='printf %s "$KIT_SECRET"')).outcome == (0, secret, "")

    async def test_output_streaming_gives_the_output_while_the_call_runs(self, provider: SandboxProvider,
                                                                          kit: ContractResources) -> None:
        """``output_streaming``: the sink has a call's first output before the call returns (the call waits for a
        file the kit writes only once it saw that output), and the pieces joined are the result's streams."""
        if not provider.capabilities().supports(Capability.OUTPUT_STREAMING):
            pytest.skip(f"{provider.name} does not declare output_streaming (its output comes in the result)")
        handle = await kit.provision()
        pieces: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        seen_first = asyncio.Event()

        def sink(stream: Stream, data: bytes) -> None:
            pieces[stream].append(data)
            if b"first" in b"".join(pieces["stdout"]):
                seen_first.set()

        command = ("printf 'first\\n'; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
                   "printf second; printf oops >&2")
        with streaming_to(sink):
            running = asyncio.ensure_future(kit.run(handle, "shell", command=command))
        waiter = asyncio.ensure_future(seen_first.wait())
        await asyncio.wait([running, waiter], return_when=asyncio.FIRST_COMPLETED)
        assert seen_first.is_set() and not running.done(), "the call's first output did not reach the sink before it returned"
        await kit.run(handle, "write_file", path="go", contents="")
        result = await running
        assert result.outcome == (0, "first\nsecond", "oops")
        assert b"".join(pieces["stdout"]).decode() == result.stdout and b"".join(pieces["stderr"]).decode() == result.stderr

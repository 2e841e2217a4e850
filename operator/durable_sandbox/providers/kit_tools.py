"""The provider contract kit's cases of the tool types: shell, write_file, read_file (``providers/testing.py``)."""

from __future__ import annotations

import uuid

from durable_sandbox.providers.contract import (
    SandboxProvider,
)
from durable_sandbox.providers.kit_base import ContractResources, ProviderKit

__all__ = ["ToolCases"]


class ToolCases(ProviderKit):
    """shell, write_file and read_file as contract v1 states them; sandboxes are separate; the spec's env reaches
    commands but never the handle."""

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

"""A call's outcome as a model reads it (the MCP tools of `dsb mcp` and of the call API's MCP endpoint): one text for
both, so an agent sees the same answer whichever door it came through. Imports nothing of the package."""

from __future__ import annotations

__all__ = ["outcome_text"]


def outcome_text(exit_code: int, stdout: str, stderr: str, *, cut: bool) -> str:
    """The exit code, then each stream that has something; ``cut``: the journal kept only each stream's ends."""
    parts = [f"exit code {exit_code}"]
    if stdout:
        parts.append(f"stdout:\n{stdout}")
    if stderr:
        parts.append(f"stderr:\n{stderr}")
    if cut:
        parts.append("(output cut to its first and last 64 KiB per stream)")
    return "\n".join(parts)

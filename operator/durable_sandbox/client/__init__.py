"""A Python client for a Sandbox's call API (served by `dsb operator --session-port`; docs/agents.md).

    from durable_sandbox.client import SandboxClient

    with SandboxClient.attach("dev-box", namespace="demo", url="https://durable-sandbox.example:8443") as box:
        box.write_file("notes.txt", "hi\\n")
        print(box.run("cat notes.txt").stdout)

Every call carries an operation id (made for it unless given): a call whose request or answer was lost is sent
again with the same id until it is answered, and the Sandbox's journal makes sure it runs once.
``AsyncSandboxClient`` is the same on asyncio. ``stream`` runs a command and yields its output while it runs
(``Output``), then its ``CallResult``; ``snapshot`` takes a journaled snapshot now.
"""

from durable_sandbox.client.calls import (
    AsyncSandboxClient,
    CallResult,
    SandboxCallError,
    SandboxClient,
    SnapshotResult,
)
from durable_sandbox.client.streaming import Output

__all__ = ["AsyncSandboxClient", "CallResult", "Output", "SandboxCallError", "SandboxClient", "SnapshotResult"]

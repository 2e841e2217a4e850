"""Exit codes and the one error type commands raise to stop with a message."""

from __future__ import annotations

from durable_sandbox.engine import RunState

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed or was cancelled
EXIT_USAGE = 2  # bad arguments, invalid manifest or input, unknown run or workflow
EXIT_WAITING = 3  # the run waits on a callback or a timer
EXIT_LEASE_HELD = 4  # another live worker executes the run (its lease is held); `dsb resume --wait` waits
EXIT_TIMEOUT = 5  # `dsb wait --timeout` gave up before the run finished or waited (the run goes on)
# Interrupted by a signal: 128 + its number (130 for Ctrl-C, 143 for SIGTERM), as shells report it.


class Interrupted(Exception):
    """A signal (Ctrl-C, SIGTERM) stopped the command; ``run_id`` names the run it was driving, which
    is left resumable (its sandboxes hibernated, its status pending)."""

    def __init__(self, run_id: str | None = None, signum: int = 2) -> None:
        super().__init__(run_id)
        self.run_id = run_id
        self.signum = signum

    @property
    def code(self) -> int:
        return 128 + self.signum


class CliError(Exception):
    """Stops the command: ``error: <message>`` on stderr and exit ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def exit_code_for(state: RunState) -> int:
    if state.status == "succeeded":
        return EXIT_OK
    if state.status in ("failed", "cancelled"):
        return EXIT_FAILED
    return EXIT_WAITING

"""Exit codes and the one error type commands raise to stop with a message."""

from __future__ import annotations

from durable_sandbox.engine import RunState

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed or was cancelled
EXIT_USAGE = 2  # bad arguments, invalid manifest or input, unknown run or workflow
EXIT_WAITING = 3  # the run waits on a callback or a timer
EXIT_TIMEOUT = 4  # `dsb wait --timeout` gave up before the run finished or waited


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

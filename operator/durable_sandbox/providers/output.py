"""Bounded tool-call output: the first and last ``OUTPUT_KEEP_BYTES`` of a stream, and its full size.

A call that prints 50 MB must not cost 50 MB of memory per copy, nor 50 MB per row of the journal. Providers
feed output into an :class:`OutputBuffer` as it arrives (memory stays bounded however much is printed), and
the sandbox session caps every result it journals with :func:`cap_text` (so the journal stays bounded
whatever a provider returns). Truncated text says so inside itself, with the number of bytes left out, and
the result records the full size.
"""

from __future__ import annotations

OUTPUT_KEEP_BYTES = 64 * 1024
# cap_text leaves alone text that is over the limit only by what an OutputBuffer's own marker (and a few
# replacement characters at the cut) add, so capping twice changes nothing.
_SLACK_BYTES = 1024


def truncation_marker(omitted: int, size: int, head: int, tail: int) -> str:
    return (
        f"\n[... output truncated: {omitted} of {size} bytes left out; the first {head} and the last {tail} "
        f"bytes are kept ...]\n"
    )


class OutputBuffer:
    """Keeps the first and the last ``keep`` bytes fed to it and counts all of them."""

    def __init__(self, keep: int = OUTPUT_KEEP_BYTES) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.size = 0

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def skip(self, count: int) -> None:
        """Count ``count`` bytes that were not read (a file's middle); what came before is no longer the tail."""
        if count > 0:
            self.size += count
            self.tail.clear()

    @property
    def truncated(self) -> bool:
        return self.size > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        omitted = self.size - len(self.head) - len(self.tail)
        return (
            self.head.decode("utf-8", errors="replace")
            + truncation_marker(omitted, self.size, len(self.head), len(self.tail))
            + self.tail.decode("utf-8", errors="replace")
        )

    @property
    def full_size(self) -> int | None:
        """The stream's size in bytes when it was truncated (what a ToolResult records), else None."""
        return self.size if self.truncated else None


def cap_text(text: str, keep: int = OUTPUT_KEEP_BYTES) -> tuple[str, int | None]:
    """``text`` cut to its first and last ``keep`` bytes, and its full size if it was cut (else None)."""
    if len(text) <= 2 * keep:  # characters are at least one byte each: the cheap common case
        return text, None
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= 2 * keep + _SLACK_BYTES:
        return text, None
    buffer = OutputBuffer(keep)
    buffer.feed(data)
    return buffer.text(), buffer.size

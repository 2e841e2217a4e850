"""A free TCP port on loopback, for a server a test starts (one definition for every tier and the benchmarks)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port nothing listens on now. The kernel may hand it out again before the server binds it: servers that
    can report the port they bound (port 0) are better started that way; this is for those that cannot."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

"""Example third-party durable-sandbox provider (``dirsnap``)."""

from dsb_dirsnap.provider import DirSnapProvider

__all__ = ["DirSnapProvider"]

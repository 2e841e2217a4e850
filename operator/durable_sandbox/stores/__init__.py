"""Stores: where runs, journals, signals, cache and thread state persist."""

from durable_sandbox.stores.sqlite import SqliteStore, default_home

__all__ = ["SqliteStore", "default_home"]

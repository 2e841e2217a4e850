"""Fixtures shared by every tier."""

from tests.fakes.fixtures import fake_e2b

__all__ = ["fake_e2b"]

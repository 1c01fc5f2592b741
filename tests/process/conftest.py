"""Fixtures every process test may use."""

from tests.process.backends import backend

__all__ = ["backend"]

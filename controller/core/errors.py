"""Exceptions shared by the managers."""

from __future__ import annotations


class InvariantViolation(Exception):
    """A record contradicts the state it is replayed onto: the log is corrupt."""

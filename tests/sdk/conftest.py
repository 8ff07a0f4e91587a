"""Fixtures of the SDK tests (the harness itself lives in sdk_testing.py)."""

from sdk_testing import swarm

__all__ = ["swarm"]

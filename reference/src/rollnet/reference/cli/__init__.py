"""The ``rollnet`` command line.

Each command group lives in its own module exposing ``register(subparsers)``; this module only
assembles them. Handlers return a process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules under rollnet.reference.cli, each defining register(subparsers).
_COMMAND_MODULES: tuple[str, ...] = (
    "model",
    "ledger",
    "keys",
    "coordinator",
    "nodes",
    "checkpoint",
    "worker",
    "validator",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the full ``rollnet`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="rollnet",
        description="rollnet: reinforcement learning on a permissionless swarm of GPUs.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"rollnet.reference.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rollnet`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

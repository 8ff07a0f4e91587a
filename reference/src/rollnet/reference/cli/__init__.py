"""The ``rollnet`` command line.

Each command group lives in its own module exposing ``register(subparsers)``; this module only
assembles them and runs the chosen handler through the one error-handling layer
(:mod:`rollnet.reference.cli.errors`): a failing command prints one line and exits 2. Handlers
return a process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rollnet.reference.cli.errors import OneLineParser, run_handler

# Modules under rollnet.reference.cli, each defining register(subparsers). The trainer and the
# relay add theirs here.
_COMMAND_MODULES: tuple[str, ...] = (
    "coordinator",
    "worker",
    "validator",
    "demo",
    "keys",
    "model",
    "ledger",
    "nodes",
    "checkpoint",
    "rollouts",
    "dashboard",
    "conformance",
    "relay",
)


def version() -> str:
    """The installed versions of the three rollnet distributions."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    parts = []
    for distribution in ("rollnet-reference", "rollnet-sdk", "rollnet-ledger"):
        try:
            parts.append(f"{distribution} {installed(distribution)}")
        except PackageNotFoundError:
            parts.append(f"{distribution} (not installed)")
    return ", ".join(parts)


def build_parser() -> OneLineParser:
    """Build the full ``rollnet`` argument parser."""
    parser = OneLineParser(
        prog="rollnet",
        description="rollnet: reinforcement learning on a permissionless swarm of GPUs.",
        epilog="'rollnet COMMAND --help' documents each command. Errors are one line, exit 2.",
    )
    parser.add_argument("--version", action="version", version=f"rollnet: {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"rollnet.reference.cli.{name}")
        module.register(subparsers)
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command's namespace its full name (``rollnet nodes list``) for messages."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.set_defaults(prog=command.prog)
                _name_commands(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rollnet`` console script."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("rollnet: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exited:  # --help, --version, or an argument error already printed
        return exited.code if isinstance(exited.code, int) else 0
    prog: str = args.prog
    return run_handler(prog, args.handler, args)


if __name__ == "__main__":
    sys.exit(main())

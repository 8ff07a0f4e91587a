"""``rollnet coordinator``: run the reference coordinator."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rollnet.reference.coordinator.config import (
    ConfigError,
    add_arguments,
    environment,
    load_config,
)


def register(subparsers: Any) -> None:
    """Add the ``coordinator`` command."""
    parser = subparsers.add_parser(
        "coordinator",
        help="run the reference coordinator",
        description=(
            "Run the rollnet coordinator: admits nodes, dispatches tasks, takes commitments, "
            "routes validation and keeps the contribution ledger. Options come from the TOML "
            "file, then ROLLNET_COORDINATOR_* environment variables, then flags."
        ),
    )
    add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", help="log level (default INFO)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the configuration and serve until SIGTERM/SIGINT."""
    from rollnet.reference.coordinator.server import serve_forever
    from rollnet.reference.logs import configure_logging

    try:
        config = load_config(
            args.data_dir, config_file=args.config, environ=environment(), flags=vars(args)
        )
    except ConfigError as error:
        print(f"rollnet coordinator: {error}")
        return 2
    configure_logging(args.log_level)
    from rollnet.reference.envs.isolation import protect_paths

    # Demands for a verifiers environment have its taskset listed in a sandboxed child: the
    # coordinator's key and ledger stay out of it.
    protect_paths(config.data_dir, config.resolved_key_file)
    try:
        asyncio.run(serve_forever(config))
    except ConfigError as error:  # found on start: the listen address cannot be served
        print(f"rollnet coordinator: {error}")
        return 2
    return 0

"""``rollnet coordinator``: run the reference coordinator."""

from __future__ import annotations

import argparse
import asyncio
import textwrap
from typing import Any

from rollnet.reference.cli.option_types import log_level
from rollnet.reference.coordinator.config import (
    ENV_PREFIX,
    TOML_ONLY_HELP,
    add_arguments,
    environment,
    load_config,
)


def register(subparsers: Any) -> None:
    """Add the ``coordinator`` command."""
    parser = subparsers.add_parser(
        "coordinator",
        help="run the reference coordinator",
        description=textwrap.fill(
            "Run the rollnet coordinator: admits nodes, dispatches tasks, takes commitments, "
            "routes validation and keeps the contribution ledger. Options come from the TOML "
            f"file, then {ENV_PREFIX}* environment variables, then flags. Ctrl-C or SIGTERM "
            "stops it within a second or two (in-flight calls finish, long polls end, the "
            "ledger's chain head is signed); a second Ctrl-C stops it at once.",
            width=96,
        ),
        epilog=TOML_ONLY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument(
        "--log-level", type=log_level, default="INFO", help="DEBUG, INFO, WARNING or ERROR"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the configuration and serve until SIGTERM/SIGINT (errors: one line, exit 2)."""
    from rollnet.reference.cli.errors import CliError
    from rollnet.reference.coordinator.server import serve_forever
    from rollnet.reference.logs import configure_logging
    from rollnet.reference.memory_trace import MemoryTraceSettings, traced

    try:
        trace = MemoryTraceSettings.from_environment(environment())
    except ValueError as error:
        raise CliError(str(error)) from None
    config = load_config(
        args.data_dir, config_file=args.config, environ=environment(), flags=vars(args)
    )
    configure_logging(args.log_level)
    from rollnet.reference.envs.isolation import protect_paths

    # Demands for a verifiers environment have its taskset listed in a sandboxed child: the
    # coordinator's key and ledger stay out of it.
    protect_paths(config.data_dir, config.resolved_key_file)
    if trace is None:
        asyncio.run(serve_forever(config))
    else:
        # Diagnostics for soaks (docs/reliability.md): tracemalloc reports appended to a file.
        asyncio.run(traced(serve_forever(config), trace))
    return 0

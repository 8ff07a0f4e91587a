"""``rollnet validator``: run the reference validator."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rollnet.reference.cli import node_options
from rollnet.reference.cli.errors import EXIT_REFUSED
from rollnet.reference.cli.option_types import (
    compute_dtype,
    directory,
    listen_address,
    network_id,
)
from rollnet.sdk.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT32
from rollnet.sdk.node import DEFAULT_NETWORK_ID


def register(subparsers: Any) -> None:
    """Add the ``validator`` command."""
    parser = subparsers.add_parser(
        "validator",
        help="run the reference validator",
        description=(
            "Run a rollnet validator (its key must be on the coordinator's validators "
            "allow-list): pull validation jobs, fetch the rollout blob and the claimed "
            "checkpoint (verified against its manifest), re-run one batched prefill, check "
            "integrity, binding, assigned data, TOPLOC, sampling, termination and rewards, and "
            "submit the verdict. SIGTERM/SIGINT: finish the job in hand, deregister, exit 0."
        ),
    )
    parser.add_argument(
        "--coordinator",
        required=True,
        type=node_options.address,
        help="coordinator address HOST:PORT",
    )
    parser.add_argument(
        "--key", type=Path, required=True, help="Ed25519 key file (created, mode 0600, if missing)"
    )
    parser.add_argument("--data-dir", type=directory, required=True, help="checkpoint cache")
    parser.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        help=f"network id (audience; default {DEFAULT_NETWORK_ID})",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device: cpu, cuda, cuda:N, mps (default: cpu); refused at start when this "
        "machine has no such device",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        type=compute_dtype,
        default=None,
        metavar="|".join(COMPUTE_DTYPES),
        help="a dtype this validator may prefill in (repeatable; default both): each job is "
        "prefilled in the dtype its task prescribes, with that dtype's calibrated thresholds",
    )
    parser.add_argument(
        "--metrics-listen",
        type=listen_address,
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus /metrics on HOST:PORT (default: none)",
    )
    node_options.add_node_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build the validator from the flags and serve until signalled."""
    from rollnet.reference.logs import configure_logging
    from rollnet.reference.validator import (
        Validator,
        ValidatorConfig,
        ValidatorFatalError,
        ValidatorMetrics,
    )
    from rollnet.sdk.node import run_until_signalled

    configure_logging(args.log_level)
    node_options.apply(args)
    node_options.check_device(args.device)
    metrics = ValidatorMetrics()
    if args.metrics_listen:
        # Before the key is created or anything registers: a port in use stops the start.
        node_options.serve_metrics(metrics.registry, args.metrics_listen)
    hint = "; add the node id to the coordinator's validators allow-list"
    identity = node_options.start_node("validator", args, hint)
    if identity is None:
        return 2
    config = ValidatorConfig(
        target=args.coordinator,
        data_dir=args.data_dir,
        network_id=args.network_id,
        device=args.device,
        dtypes=tuple(dict.fromkeys(args.dtype)) if args.dtype else (FLOAT32, BFLOAT16),
        keep_checkpoints=args.keep_checkpoints,
        relays=args.relay,
        pull_wait=args.pull_wait,
        reward_time_limit_s=args.reward_time_limit,
        reward_isolation=args.reward_isolation,
    )
    validator = Validator(config, identity, metrics=metrics)
    try:
        asyncio.run(run_until_signalled(validator))
    except ValidatorFatalError as error:
        print(f"rollnet validator: refused by the coordinator: {error}", file=sys.stderr)
        return EXIT_REFUSED
    return 0

"""``rollnet trainer``: run the reference trainer."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from rollnet.reference.cli import node_options
from rollnet.reference.cli.errors import EXIT_REFUSED, CliError
from rollnet.reference.cli.option_types import (
    directory,
    listen_address,
    log_level,
    network_id,
    whole,
)
from rollnet.sdk.node import DEFAULT_NETWORK_ID


def register(subparsers: Any) -> None:
    """Add the ``trainer`` command."""
    parser = subparsers.add_parser(
        "trainer",
        help="run the reference trainer (asynchronous GRPO)",
        description=(
            "Run the rollnet trainer (its key must be on the coordinator's trainers "
            "allow-list): declare demand for rollouts, follow the stream of accepted ones, "
            "assemble GRPO groups within the staleness bound, take an optimizer step per "
            "batch and publish each new checkpoint (bf16, signed manifest). Restarting with "
            "the same --data-dir resumes at the last committed step. SIGTERM/SIGINT: finish "
            "the step in hand, deregister, exit 0. See docs/trainer.md."
        ),
    )
    parser.add_argument(
        "--coordinator", required=True, type=node_options.address, help="coordinator HOST:PORT"
    )
    parser.add_argument(
        "--key", type=Path, required=True, help="Ed25519 key file (created, mode 0600, if missing)"
    )
    parser.add_argument(
        "--model", type=Path, required=True, metavar="DIR", help="starting model (HF directory)"
    )
    parser.add_argument(
        "--data-dir",
        type=directory,
        required=True,
        help="state, checkpoints and metrics (metrics.jsonl)",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="trainer TOML configuration")
    parser.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        help=f"network id (audience; default {DEFAULT_NETWORK_ID})",
    )
    parser.add_argument(
        "--max-steps",
        type=whole("steps", minimum=0),
        default=None,
        help="stop after this step (overrides the config's max_steps; 0: never)",
    )
    parser.add_argument(
        "--metrics-listen",
        type=listen_address,
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus /metrics on HOST:PORT (default: none)",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default INFO)",
    )
    parser.add_argument(
        "--origin-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write each checkpoint's blobs to DIR (serve them with rollnet relay --origin "
        "DIR; the blobs of old checkpoints are deleted; docs/broadcast.md)",
    )
    parser.add_argument(
        "--no-deltas",
        action="store_true",
        help="publish full checkpoints only, no deltas against the step before",
    )
    node_options.add_reward_time_limit(parser)
    node_options.add_reward_isolation(parser)
    node_options.add_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build the trainer from the flags and train until done or signalled."""
    from rollnet.reference.checkpoint_publishing import CheckpointDirError, model_files
    from rollnet.reference.envs import (
        EnvironmentConfigError,
        EnvironmentRegistryError,
        UnknownEnvironmentError,
        load_environment,
    )
    from rollnet.reference.logs import configure_logging
    from rollnet.reference.trainer.config import (
        TrainerConfig,
        TrainerConfigError,
        load_trainer_config,
    )
    from rollnet.reference.trainer.metrics import TrainerMetrics
    from rollnet.reference.trainer.node import Trainer, TrainerFatalError, TrainerSettings
    from rollnet.sdk.node import run_until_signalled

    configure_logging(args.log_level)
    node_options.apply(args)
    try:
        config = load_trainer_config(args.config) if args.config else TrainerConfig()
        if args.max_steps is not None:
            config = dataclasses.replace(config, max_steps=args.max_steps)
    except TrainerConfigError as error:
        raise CliError(f"--config {error}") from None
    try:
        load_environment(config.environment, config.environment_config)
    except (UnknownEnvironmentError, EnvironmentConfigError, EnvironmentRegistryError) as error:
        raise CliError(f"--config environment: {error}") from None
    try:
        model_files(args.model)
    except CheckpointDirError as error:
        raise CliError(f"--model {error}") from None
    node_options.check_device(config.device)
    metrics = TrainerMetrics()
    # Under torchrun only rank 0 is the node; the others would find the port taken.
    if args.metrics_listen and int(os.environ.get("RANK", "0")) == 0:
        node_options.serve_metrics(metrics.registry, args.metrics_listen)
    hint = "; add the node id to the coordinator's trainers allow-list"
    identity = node_options.start_node("trainer", args, hint)
    if identity is None:
        return 2
    settings = TrainerSettings(
        target=args.coordinator,
        model_dir=args.model,
        data_dir=args.data_dir,
        config=config,
        network_id=args.network_id,
        reward_isolation=args.reward_isolation,
        reward_time_limit_s=args.reward_time_limit,
        publish_deltas=not args.no_deltas,
        origin_dir=args.origin_dir,
    )
    trainer = Trainer(settings, identity, metrics=metrics)
    try:
        asyncio.run(run_until_signalled(trainer))
    except TrainerFatalError as error:
        print(f"rollnet trainer: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except ValueError as error:  # an unreadable state directory
        raise CliError(str(error)) from None
    return 0

"""``rollnet worker``: run the reference inference worker."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rollnet.reference.cli import node_options
from rollnet.reference.cli.errors import EXIT_REFUSED, CliError
from rollnet.reference.cli.option_types import (
    compute_dtype,
    directory,
    network_id,
    readable_file,
)
from rollnet.sdk.dtypes import COMPUTE_DTYPES, FLOAT32
from rollnet.sdk.node import DEFAULT_NETWORK_ID
from rollnet.sdk.version import software_version


def register(subparsers: Any) -> None:
    """Add the ``worker`` command."""
    parser = subparsers.add_parser(
        "worker",
        help="run the reference inference worker",
        description=(
            "Run a rollnet worker: register the key, pull tasks, fetch and verify checkpoints, "
            "generate rollouts with seeded Gumbel-max sampling and TOPLOC proofs, commit them. "
            "SIGTERM/SIGINT: stop pulling, finish or give back leases, deregister, exit 0."
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
    parser.add_argument(
        "--data-dir", type=directory, required=True, help="outbox, receipts and checkpoints"
    )
    parser.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        help=f"network id (audience; default {DEFAULT_NETWORK_ID})",
    )
    parser.add_argument(
        "--tls-ca", type=readable_file, default=None, help="PEM root certificates: connect with TLS"
    )
    parser.add_argument("--tls-server-name", default=None, help="expected TLS server name")
    parser.add_argument(
        "--backend",
        choices=("torch", "vllm"),
        default="torch",
        help="inference backend (default torch; vllm needs a GPU and the [vllm] extra)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="torch device: cpu, cuda, cuda:N, mps (default: cpu; vllm: cuda); refused at start "
        "when this machine has no such device",
    )
    parser.add_argument(
        "--dtype",
        type=compute_dtype,
        default=FLOAT32,
        metavar="|".join(COMPUTE_DTYPES),
        help="dtype to compute in (default float32); must be the network's compute dtype, or "
        "the coordinator refuses the worker at registration",
    )
    parser.add_argument(
        "--environment",
        action="append",
        default=[],
        help="serve only this environment (repeatable; default: any)",
    )
    parser.add_argument(
        "--max-concurrent-tasks",
        type=node_options.whole("tasks"),
        default=1,
        help="leases held at once (default 1)",
    )
    parser.add_argument(
        "--batch-size",
        type=node_options.whole("completions"),
        default=64,
        help="completions per backend call",
    )
    parser.add_argument(
        "--drain-timeout",
        type=node_options.seconds(0.0, 86_400.0),
        default=60.0,
        help="seconds (default 60)",
    )
    node_options.add_node_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build the worker from the flags and serve until signalled."""
    from rollnet.reference.logs import configure_logging
    from rollnet.reference.worker import InferenceGenerator, make_backend
    from rollnet.sdk.broadcast import TerminalProgress
    from rollnet.sdk.checkpoints import CheckpointStore
    from rollnet.sdk.client import TlsConfig
    from rollnet.sdk.worker import Worker, WorkerConfig, WorkerFatalError, run_until_signalled

    configure_logging(args.log_level)
    node_options.apply(args)
    from rollnet.reference.envs import available_environments

    installed = available_environments()
    unknown = sorted(set(args.environment) - set(installed))
    if unknown:
        raise CliError(
            f"--environment {', '.join(unknown)}: not installed here "
            f"(installed: {', '.join(sorted(installed))})"
        )
    device = args.device or ("cuda" if args.backend == "vllm" else "cpu")
    # Before registering: a worker that cannot run its backend would lease tasks and fail each.
    node_options.check_backend(args.backend, device)
    refuse_math_mode(args.dtype, device)
    identity = node_options.start_node("worker", args)
    if identity is None:
        return 2
    checkpoints = CheckpointStore(
        args.data_dir / "checkpoints",
        network_id=args.network_id,
        keep=args.keep_checkpoints,
        relays=node_options.relay_source(args.relay, args.data_dir),
        progress=TerminalProgress("checkpoint"),
    )
    generator = InferenceGenerator(
        lambda: make_backend(args.backend),
        checkpoints,
        device=device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        reward_time_limit_s=args.reward_time_limit,
        reward_isolation=args.reward_isolation,
    )
    tls = None
    if args.tls_ca is not None or args.tls_server_name is not None:
        tls = TlsConfig(root_certificates=args.tls_ca, server_name_override=args.tls_server_name)
    config = WorkerConfig(
        target=args.coordinator,
        tls=tls,
        data_dir=args.data_dir,
        network_id=args.network_id,
        backends=(args.backend,),
        environments=tuple(args.environment),
        dtypes=(args.dtype,),
        max_concurrent_tasks=args.max_concurrent_tasks,
        software_version=software_version("reference-worker"),
        pull_wait=args.pull_wait,
        drain_timeout=args.drain_timeout,
    )
    worker = Worker(config, identity, generator)
    try:
        asyncio.run(run_until_signalled(worker))
    except WorkerFatalError as error:
        print(f"rollnet worker: refused by the coordinator: {error}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        generator.close()
    return 0


def refuse_math_mode(dtype: str, device: str) -> None:
    """Refuse to start under a math mode the network's dtype rejects (TF32, bfloat16 GEMMs on
    a float32 network). PyTorch's own default lets cuDNN use TF32, which no environment
    variable turns off: on a CUDA device that one is turned off here, the rest is refused."""
    from rollnet.reference.inference.base import DType
    from rollnet.reference.inference.math_mode import math_mode_problems, refuse_message

    if dtype == "float32" and device.startswith("cuda"):
        import torch

        torch.backends.cudnn.allow_tf32 = False
    network: DType = "float32" if dtype == "float32" else "bfloat16"
    problems = math_mode_problems(network, device)
    if problems:
        raise CliError(f"--dtype {dtype}: {refuse_message(network, problems)}")

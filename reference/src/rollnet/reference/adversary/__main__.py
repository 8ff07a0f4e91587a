"""``python -m rollnet.reference.adversary``: run one cheating worker process."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from rollnet.reference.cli import node_options
from rollnet.sdk.node import DEFAULT_NETWORK_ID


def build_parser() -> argparse.ArgumentParser:
    """The adversary's flags (a subset of ``rollnet worker``'s, plus ``--cheat``)."""
    from rollnet.reference.adversary.cheats import CHEATS

    parser = argparse.ArgumentParser(
        prog="python -m rollnet.reference.adversary",
        description="Run a worker that cheats in one configured way (for tests and the demo).",
    )
    parser.add_argument("--cheat", required=True, choices=[c.value for c in CHEATS])
    parser.add_argument("--coordinator", required=True, help="coordinator address HOST:PORT")
    parser.add_argument("--key", type=Path, required=True, help="Ed25519 key file")
    parser.add_argument("--data-dir", type=Path, required=True, help="outbox and checkpoints")
    parser.add_argument("--network-id", default=DEFAULT_NETWORK_ID, help="network id (audience)")
    parser.add_argument("--pull-wait", type=float, default=20.0, help="long-poll seconds")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the network's compute dtype (default float32)",
    )
    parser.add_argument("--log-level", default="INFO")
    node_options.add_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until the coordinator ejects the node (exit 1)."""
    args = build_parser().parse_args(argv)

    from rollnet.reference.adversary.cheats import Cheat, build_cheating_worker
    from rollnet.reference.logs import configure_logging
    from rollnet.sdk.identity import Identity
    from rollnet.sdk.worker import Backoff, WorkerConfig, WorkerFatalError, run_until_signalled

    configure_logging(args.log_level)
    node_options.apply(args)
    if args.key.exists():
        identity = Identity.load(args.key)
    else:
        identity = Identity.generate()
        identity.save(args.key)
    config = WorkerConfig(
        target=args.coordinator,
        data_dir=args.data_dir,
        network_id=args.network_id,
        backends=("torch",),
        dtypes=(args.dtype,),
        software_version=f"rollnet-adversary/{args.cheat}",
        pull_wait=args.pull_wait,
        backoff=Backoff(initial=0.2, maximum=2.0),
        # An ejected cheater has nothing left to finish: do not linger.
        drain_timeout=5.0,
        deregister_timeout=3.0,
    )
    worker = build_cheating_worker(Cheat(args.cheat), config, identity)
    try:
        asyncio.run(run_until_signalled(worker))
    except WorkerFatalError as error:
        print(f"adversary ({args.cheat}): refused by the coordinator: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

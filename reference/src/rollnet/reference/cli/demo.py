"""``rollnet demo``: the local demo swarm (coordinator, workers, validators, a cheater)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``demo`` command."""
    parser = subparsers.add_parser(
        "demo",
        help="run a local swarm: coordinator, workers, validators and a cheating worker",
        description=(
            "Start a coordinator, publish the tiny model, start workers, validators and "
            "cheating workers as separate processes, ask for rollouts round by round and show "
            "what the swarm accepted, rejected and credited; then verify the ledger."
        ),
    )
    parser.add_argument("--data-dir", type=Path, default=Path(".data/demo"))
    parser.add_argument("--workers", type=int, default=2, help="honest workers (default 2)")
    parser.add_argument("--validators", type=int, default=1, help="validators (default 1)")
    parser.add_argument(
        "--cheat",
        action="append",
        default=None,
        help="start a cheating worker with this cheat (repeatable; default token_altered; "
        "'none' for no cheater)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rollout rounds (default 3)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per round (default 8)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--port", type=int, default=0, help="coordinator port (default: free)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and return its exit code."""
    from rollnet.reference.demo import DemoConfig, run_demo

    cheats = tuple(c for c in (args.cheat or ["token_altered"]) if c != "none")
    config = DemoConfig(
        data_dir=args.data_dir,
        workers=args.workers,
        validators=args.validators,
        cheats=cheats,
        rounds=args.rounds,
        prompts_per_round=args.prompts,
        samples_per_prompt=args.samples,
        max_new_tokens=args.max_new_tokens,
        port=args.port,
    )
    return asyncio.run(run_demo(config))

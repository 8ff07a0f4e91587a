"""``rollnet demo``: the local demo swarm (coordinator, workers, validators, a cheater)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from rollnet.reference.cli.errors import EXIT_INTERRUPTED
from rollnet.reference.demo_control import StopSignals


def register(subparsers: Any) -> None:
    """Add the ``demo`` command."""
    parser = subparsers.add_parser(
        "demo",
        help="run a local swarm that learns: coordinator, trainer, workers, validators, a cheater",
        description=(
            "Warm-start the tiny model on the reverse environment's format, start a "
            "coordinator, the trainer, workers, validators and cheating workers as separate "
            "processes, and follow the reward step by step as GRPO raises it; then show the "
            "ledger (credits, slashes) and verify it. On a terminal a live panel shows the "
            "swarm as the coordinator's dashboard sees it (plain lines otherwise). Leaves "
            "trainer/metrics.jsonl, reward.png and the ledger's export ledger.jsonl in the data "
            "directory. Ctrl-C or SIGTERM stops every process and still prints the summary "
            "(a second Ctrl-C forces). See docs/demo.md."
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
        "'none' for no cheater; the names: python -m rollnet.reference.adversary --help)",
    )
    parser.add_argument(
        "--steps", "--rounds", type=int, default=50, help="trainer steps (default 50)"
    )
    parser.add_argument("--prompts", type=int, default=32, help="GRPO groups per step (32)")
    parser.add_argument("--samples", type=int, default=8, help="completions per group (8)")
    parser.add_argument("--prompts-per-task", type=int, default=4, help="groups per task (4)")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument(
        "--max-off-policy-steps",
        type=int,
        default=1,
        help="staleness bound: steps a rollout's checkpoint may lag (default 1)",
    )
    parser.add_argument(
        "--warm-start-steps", type=int, default=400, help="warm-start steps (default 400)"
    )
    parser.add_argument("--port", type=int, default=0, help="coordinator port (default: free)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and return its exit code."""
    from rollnet.reference.demo import DemoConfig
    from rollnet.reference.demo_control import check_options

    cheats = tuple(c for c in (args.cheat or ["token_altered"]) if c != "none")
    config = DemoConfig(
        data_dir=args.data_dir,
        workers=args.workers,
        validators=args.validators,
        cheats=cheats,
        steps=args.steps,
        prompts_per_step=args.prompts,
        samples_per_prompt=args.samples,
        prompts_per_task=args.prompts_per_task,
        max_new_tokens=args.max_new_tokens,
        max_off_policy_steps=args.max_off_policy_steps,
        warm_start_steps=args.warm_start_steps,
        port=args.port,
    )
    check_options(config)  # before a file is written or a process started
    return asyncio.run(_supervised(config))


async def _supervised(config: Any) -> int:
    """Run the demo with Ctrl-C and SIGTERM handled (see ``demo_control.StopSignals``)."""
    from rollnet.reference.demo import run_demo

    stop = StopSignals()
    task = asyncio.create_task(run_demo(config, stop))
    stop.install(task)
    try:
        return await task
    except asyncio.CancelledError:
        # Stopped before the trainer's first step: the processes are stopped, nothing to sum up.
        print(f"stopped by {stop.signal_name} before training began", flush=True)
        return EXIT_INTERRUPTED

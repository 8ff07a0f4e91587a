"""``rollnet model``: make local models (``init-tiny``)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from rollnet.reference.cli.option_types import directory, whole

_hidden = whole("hidden size", minimum=8, maximum=8192)


def _hidden_size(text: str) -> int:
    # Four attention heads whose dimension is even (rotary embeddings pair dimensions).
    value = _hidden(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"{value}: the hidden size must be a multiple of 8")
    return value


def _init_tiny(args: argparse.Namespace) -> int:
    started = time.monotonic()
    # Progress on stderr: importing torch and transformers alone takes seconds on a small machine.
    print(f"creating a tiny model in {args.out}: loading PyTorch ...", file=sys.stderr, flush=True)
    # Imported here so that other commands do not pay for importing torch and transformers.
    from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model

    spec = TinyModelSpec(hidden_size=args.hidden_size, num_hidden_layers=args.layers)
    print("drawing weights and writing files ...", file=sys.stderr, flush=True)
    path = init_tiny_model(args.out, seed=args.seed, spec=spec)
    print(f"wrote tiny model (seed {args.seed}) to {path} in {time.monotonic() - started:.1f} s")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``model`` command group."""
    parser = subparsers.add_parser("model", help="make local models for tests and the demo")
    commands = parser.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    init = commands.add_parser(
        "init-tiny",
        help="write a tiny Qwen2 model and character tokenizer (Hugging Face layout)",
        description=(
            "Write a tiny Qwen2-architecture model with random weights and a character "
            "tokenizer, offline (nothing is downloaded). Publish it with 'rollnet checkpoint "
            "publish --model DIR --step 0'."
        ),
    )
    init.add_argument(
        "--out", required=True, type=directory, help="output directory (created if missing)"
    )
    init.add_argument(
        "--seed", type=whole("seed", minimum=0), default=0, help="weight seed (default 0)"
    )
    init.add_argument(
        "--hidden-size",
        type=_hidden_size,
        default=64,
        help="hidden size, a multiple of 8 (default 64)",
    )
    init.add_argument(
        "--layers",
        type=whole("layers", minimum=1, maximum=64),
        default=2,
        help="transformer layers (default 2)",
    )
    init.set_defaults(handler=_init_tiny)

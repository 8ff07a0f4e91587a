"""``rollnet model``: make local models (``init-tiny``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _init_tiny(args: argparse.Namespace) -> int:
    # Imported here so that other commands do not pay for importing torch and transformers.
    from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model

    spec = TinyModelSpec(hidden_size=args.hidden_size, num_hidden_layers=args.layers)
    path = init_tiny_model(Path(args.out), seed=args.seed, spec=spec)
    print(f"wrote tiny model (seed {args.seed}) to {path}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``model`` command group."""
    parser = subparsers.add_parser("model", help="make local models for tests and the demo")
    commands = parser.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    init = commands.add_parser(
        "init-tiny", help="write a tiny Qwen2 model and character tokenizer (Hugging Face layout)"
    )
    init.add_argument("--out", required=True, help="output directory")
    init.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    init.add_argument("--hidden-size", type=int, default=64, help="hidden size (default 64)")
    init.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    init.set_defaults(handler=_init_tiny)

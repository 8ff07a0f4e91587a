"""``--torch-threads``, shared by the commands that run a model (worker, validator).

PyTorch's CPU kernels use one thread per core by default. On a machine where other processes hold
cores (a second worker, a validator, the coordinator), those threads wait on each other at every
operation and decoding can slow down a hundredfold; pinning each process to the cores it may use
avoids that.
"""

from __future__ import annotations

import argparse
from typing import Any


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} threads: at least 1")
    return value


def add_argument(parser: Any) -> None:
    """Add ``--torch-threads N`` to ``parser``."""
    parser.add_argument(
        "--torch-threads",
        type=_positive,
        default=None,
        metavar="N",
        help=(
            "PyTorch CPU threads (default: one per core); on a machine shared with other "
            "rollnet processes, give each the cores it may use"
        ),
    )


def apply(args: argparse.Namespace) -> None:
    """Set PyTorch's thread count from ``--torch-threads`` (no-op when not given)."""
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)

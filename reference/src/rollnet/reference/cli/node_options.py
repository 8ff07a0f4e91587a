"""Options shared by the commands that run a model (worker, validator), and checked argparse
types for their numbers.

``--torch-threads``:

PyTorch's CPU kernels use one thread per core by default. On a machine where other processes hold
cores (a second worker, a validator, the coordinator), those threads wait on each other at every
operation and decoding can slow down a hundredfold; pinning each process to the cores it may use
avoids that.

``--reward-time-limit``: seconds one completion's reward may take in the reward sandbox
(:class:`rollnet.reference.envs.RewardSandbox`) before its verifier is killed.

``--reward-isolation``: whether the reward sandbox's child runs isolated (namespaces, seccomp,
rlimits; :mod:`rollnet.reference.envs.isolation`). ``auto`` isolates where the host can and
warns where it cannot; environments whose code is untrusted (``verifiers``) or that run
programs (``code``) are refused there either way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def whole(what: str, minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number of ``what``, at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} {what}: at least {minimum}")
        return value

    return parse


def seconds(minimum: float, maximum: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds in ``[minimum, maximum]`` (NaN and inf refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"{text}: must be a number of seconds from {minimum:g} to {maximum:g}"
            )
        return value

    return parse


_positive = whole("threads")


def address(text: str) -> str:
    """An argparse type: ``HOST:PORT`` (``[v6addr]:PORT`` for IPv6), the port 1-65535."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (a port 1-65535 is needed)")
    return text


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


def add_reward_time_limit(parser: Any) -> None:
    """Add ``--reward-time-limit SECONDS`` to ``parser``."""
    from rollnet.reference.envs.sandbox import DEFAULT_TIME_LIMIT_S

    parser.add_argument(
        "--reward-time-limit",
        # Below a second, verifiers that finish in an honest moment would be cut off.
        type=seconds(1.0, 86_400.0),
        default=DEFAULT_TIME_LIMIT_S,
        metavar="SECONDS",
        help=(
            "seconds one completion's reward may take before its verifier is killed and the "
            f"completion scores task reward 0 (default {DEFAULT_TIME_LIMIT_S:g})"
        ),
    )


def add_reward_isolation(parser: Any) -> None:
    """Add ``--reward-isolation auto|required|off`` to ``parser``."""
    parser.add_argument(
        "--reward-isolation",
        choices=("auto", "required", "off"),
        default="auto",
        help=(
            "run environment verifiers isolated (no network, no node files, rlimits): auto "
            "(where the host can: Linux with bubblewrap), required, or off (default auto)"
        ),
    )


def protect_node_files(command: str, data_dir: Path, key: Path, isolation: str) -> None:
    """Keep the node's data directory and key out of every sandbox this process starts, and
    warn when the host cannot isolate verifiers (``--reward-isolation auto``)."""
    from rollnet.reference.envs.isolation import isolation_problem, protect_paths

    protect_paths(data_dir, key)
    problem = isolation_problem()
    if problem is not None and isolation == "auto":
        print(
            f"rollnet {command}: warning: environment verifiers run without isolation here "
            f"({problem}); verifiers and code tasks are refused",
            file=sys.stderr,
        )


def apply(args: argparse.Namespace) -> None:
    """Set PyTorch's thread count from ``--torch-threads`` (no-op when not given)."""
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)


def node_identity(command: str, key: Path, created_hint: str = "") -> Any:
    """The node's :class:`~rollnet.sdk.identity.Identity` from ``key``, created (0600) when the
    file does not exist; ``None`` after printing why it cannot be read or written."""
    from rollnet.sdk.identity import Identity, KeyFileError

    try:
        if key.exists():
            return Identity.load(key)
        identity = Identity.generate()
        identity.save(key)
    except KeyFileError as error:
        print(f"rollnet {command}: {error}", file=sys.stderr)
        return None
    except OSError as error:
        print(f"rollnet {command}: key file {key}: {error.strerror or error}", file=sys.stderr)
        return None
    print(f"rollnet {command}: created key {key} (node {identity.node_id}){created_hint}")
    return identity


def ready_data_dir(command: str, path: Path) -> bool:
    """Create ``path`` (and its parents) if needed; ``False`` after printing why it cannot be a
    data directory (a file is in the way, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".rollnet-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        print(
            f"rollnet {command}: --data-dir {path} is not a writable directory: "
            f"{error.strerror or error}",
            file=sys.stderr,
        )
        return False
    return True


def add_node_arguments(parser: Any) -> None:
    """The options every model-running node shares: ``--keep-checkpoints``, ``--pull-wait``,
    ``--log-level``, ``--reward-time-limit``, ``--reward-isolation`` and ``--torch-threads``."""
    parser.add_argument(
        "--keep-checkpoints",
        type=whole("versions"),
        default=3,
        help="checkpoint versions kept on disk: async_level + 1 (default 3)",
    )
    parser.add_argument(
        "--pull-wait",
        type=seconds(0.0, 3600.0),
        default=20.0,
        help="long-poll seconds (default 20)",
    )
    parser.add_argument("--log-level", default="INFO", help="log level (default INFO)")
    add_reward_time_limit(parser)
    add_reward_isolation(parser)
    add_argument(parser)

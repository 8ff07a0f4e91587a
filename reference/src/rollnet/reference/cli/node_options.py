"""Options shared by the commands that run a model (worker, validator).

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
from pathlib import Path
from typing import Any

from rollnet.reference.cli.option_types import address, log_level, seconds, whole

__all__ = ["address", "seconds", "whole"]

_positive = whole("threads")


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


def start_node(command: str, args: argparse.Namespace, created_hint: str = "") -> Any:
    """What every node command does before it starts its node: the key (created when missing),
    a writable ``--data-dir``, and both kept out of reward sandboxes. ``None`` after printing
    why the key or the data directory cannot be used."""
    identity = node_identity(command, args.key, created_hint)
    if identity is None or not ready_data_dir(command, args.data_dir):
        return None
    protect_node_files(command, args.data_dir, args.key, args.reward_isolation)
    return identity


def serve_metrics(registry: Any, listen: str) -> None:
    """Serve ``registry`` on ``/metrics`` at ``HOST:PORT`` (a background thread); a port that
    cannot be listened on is a :class:`CliError` (before anything registers or is created)."""
    from prometheus_client import start_http_server

    from rollnet.reference.addresses import split_host_port
    from rollnet.reference.cli.errors import CliError

    host, port = split_host_port(listen, allow_port_zero=True)
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise CliError(
            f"--metrics-listen {listen}: cannot listen there: "
            f"{error.strerror or error} (choose another port, or leave it out)"
        ) from None


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
    parser.add_argument(
        "--log-level",
        type=log_level,
        default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default INFO)",
    )
    parser.add_argument(
        "--relay",
        type=relay_urls,
        default=(),
        metavar="URL[,URL...]",
        help=(
            "fetch checkpoint shards from these relays (rollnet relay; docs/broadcast.md), "
            "verified like any shard; the coordinator serves what they cannot (default: none)"
        ),
    )
    add_reward_time_limit(parser)
    add_reward_isolation(parser)
    add_argument(parser)


def relay_urls(text: str) -> tuple[str, ...]:
    """``URL[,URL...]`` of relays."""
    from rollnet.sdk.broadcast import relay_list

    try:
        return tuple(relay_list(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def relay_source(relays: tuple[str, ...], data_dir: Path) -> Any:
    """A :class:`~rollnet.sdk.broadcast.RelayShards` for ``--relay`` (``None`` without it);
    shards in transit are kept under the checkpoint directory across restarts."""
    if not relays:
        return None
    from rollnet.sdk.broadcast import RelayShards

    return RelayShards(relays, partial_dir=data_dir / "checkpoints" / ".relay-partial")


def check_backend(backend: str, device: str) -> None:
    """Refuse a backend or device this machine cannot run, before the node registers: otherwise
    it would lease tasks only to fail each (three attempts, then FAILED) while staying up."""
    import importlib.util

    from rollnet.reference.cli.errors import CliError

    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise CliError(
            "--backend vllm: vLLM is not installed here (pip install 'rollnet-reference[vllm]' "
            "on a machine with a GPU), or use --backend torch"
        )
    check_device(device)


def check_device(device: str) -> None:
    """Refuse ``device`` unless PyTorch can use it on this machine."""
    import torch

    from rollnet.reference.cli.errors import CliError

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise CliError(f"--device {device!r} is not a device: cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cpu":
        return
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                "this PyTorch is a CPU-only build"
                if torch.version.cuda is None
                else "no CUDA device or driver found"
            )
            raise CliError(f"--device {device}: CUDA is not available ({why}); use --device cpu")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise CliError(f"--device {device}: this machine has {count} CUDA device(s)")
        return
    if parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise CliError(f"--device {device}: Apple's MPS is not available here; use cpu")
        return
    raise CliError(f"--device {device}: only cpu, cuda and mps devices are supported")

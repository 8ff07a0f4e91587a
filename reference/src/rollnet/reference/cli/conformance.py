"""``rollnet conformance``: does an implementation speak rollnet v1 as documented?

``rollnet conformance coordinator --target HOST:PORT`` runs the coordinator suite
(:mod:`rollnet.sdk.conformance`) against any coordinator, over the wire. It prints one line per
case, closes with ``N passed, N failed, N skipped``, writes JUnit XML with ``--junit FILE``, and
exits 1 when a case failed (0 otherwise; 2 for a mistake in the command, or a target that cannot
be reached). Cases that need what the command was not given (a role's key, a restart hook, an
invite, the upload quota) are skipped, never passed.

``rollnet conformance worker --command "..."`` runs the worker suite
(:mod:`rollnet.reference.conformance.worker`) against a worker program.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from rollnet.reference.cli.errors import EXIT_OK, EXIT_REFUSED, CliError
from rollnet.reference.cli.option_types import (
    address,
    directory,
    network_id,
    output_file,
    readable_file,
    seconds,
    whole,
)
from rollnet.sdk.node import DEFAULT_NETWORK_ID


def _keys(folder: Path | None) -> dict[str, Any]:
    """The keys of ``folder`` by role (``validator.key``, ``trainer.key``, ``operator.key``)."""
    from rollnet.sdk import Identity

    if folder is None:
        return {}
    keys = {}
    for role in ("validator", "trainer", "operator"):
        path = folder / f"{role}.key"
        if path.exists():
            keys[role] = Identity.load(path)  # a KeyFileError is worded by the CLI
    if not keys:
        raise CliError(
            f"--keys {folder}: no validator.key, trainer.key or operator.key in it (the keys "
            "on the target's allow-lists, named by role)"
        )
    return keys


def _invite(text: str) -> tuple[str, str]:
    pool, sep, token = text.partition(":")
    if not sep or not pool or not token:
        raise argparse.ArgumentTypeError(f"{text!r} is not POOL:TOKEN")
    return pool, token


def _restart_hook(command: str | None) -> Any:
    if command is None:
        return None

    async def restart() -> None:
        from rollnet.sdk.conformance import CaseFailure

        process = await asyncio.create_subprocess_shell(command)
        code = await process.wait()
        if code != 0:
            raise CaseFailure(f"the restart command exited {code}")

    return restart


def _print_line(text: str) -> None:
    print(text, flush=True)


def _coordinator(args: argparse.Namespace) -> int:
    from rollnet.sdk import TlsConfig
    from rollnet.sdk.conformance import (
        CASES,
        TargetConfig,
        format_result,
        run_coordinator_suite,
        unreachable,
    )
    from rollnet.sdk.conformance.suite import select

    if args.list:
        for case in CASES:
            print(f"{case.name}  {case.summary}")
        return EXIT_OK
    if not select(CASES, args.case, args.skip):
        raise CliError("--case and --skip select no case (see --list)")
    tls = None
    if args.tls_ca is not None or args.tls_server_name:
        tls = TlsConfig(root_certificates=args.tls_ca, server_name_override=args.tls_server_name)
    pool, token = args.invite if args.invite else (None, None)
    config = TargetConfig(
        target=args.target,
        network_id=args.network_id,
        tls=tls,
        keys=_keys(args.keys),
        restart=_restart_hook(args.restart_command),
        replica=args.replica,
        invite_pool=pool,
        invite_token=token,
        upload_quota_bytes=args.upload_quota_bytes,
        max_message_bytes=args.max_message_bytes,
        environment=args.environment,
        max_wait=args.max_wait,
        call_timeout=args.timeout,
    )
    problem = asyncio.run(unreachable(config))
    if problem is not None:
        raise CliError(
            f"cannot reach {args.target} ({problem}): is it running, and are --target and "
            "--tls-ca right?"
        )
    report = asyncio.run(
        run_coordinator_suite(
            config,
            patterns=args.case,
            skip=args.skip,
            on_result=lambda r: _print_line(format_result(r)),
        )
    )
    print(report.summary())
    if args.junit is not None:
        args.junit.write_text(report.junit_xml())
    return EXIT_OK if report.ok else EXIT_REFUSED


def _worker(args: argparse.Namespace) -> int:
    from rollnet.reference.conformance.worker import (
        WORKER_CASES,
        WorkerHarnessConfig,
        run_worker_suite,
    )
    from rollnet.sdk.conformance import format_result
    from rollnet.sdk.conformance.suite import select

    if args.list:
        for case in WORKER_CASES:
            print(f"{case.name}  {case.summary}")
        return EXIT_OK
    if not select(WORKER_CASES, args.case, args.skip):
        raise CliError("--case and --skip select no case (see --list)")
    from rollnet.reference.logs import configure_logging

    # The harness's coordinator and validator log to stderr, warnings only: stdout is the
    # report, one line per case.
    configure_logging("WARNING")
    config = WorkerHarnessConfig(
        command=args.command,
        work_dir=args.work_dir,
        startup_timeout=args.startup_timeout,
    )
    report = asyncio.run(
        run_worker_suite(
            config,
            patterns=args.case,
            skip=args.skip,
            on_result=lambda r: _print_line(format_result(r)),
        )
    )
    print(report.summary())
    if args.junit is not None:
        args.junit.write_text(report.junit_xml())
    return EXIT_OK if report.ok else EXIT_REFUSED


def _common(parser: Any) -> None:
    parser.add_argument("--junit", type=output_file, metavar="FILE", help="write JUnit XML here")
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this case, or a group (auth, dispatch, ...); repeatable (default: all)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out this case or group; repeatable (e.g. errors.rate_limit on a shared "
        "target: it exhausts the per-address registration limit for a minute)",
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")


def register(subparsers: Any) -> None:
    """Add the ``conformance`` command group."""
    parser = subparsers.add_parser(
        "conformance",
        help="check that a coordinator or worker speaks rollnet v1 as documented",
        description=(
            "Black-box conformance suites. One line per case, then 'N passed, N failed, N "
            "skipped'; exit 1 when a case failed. Run them against a deployment made for "
            "testing: they publish checkpoints, credit made-up work and ban keys."
        ),
    )
    commands = parser.add_subparsers(dest="conformance_command", metavar="SUITE", required=True)
    coordinator = commands.add_parser(
        "coordinator",
        help="run the coordinator suite against HOST:PORT",
        description=(
            "Checks a coordinator over the wire against docs/protocol.md. Cases needing a key, "
            "a restart hook, an invite or the upload quota that were not given are skipped."
        ),
    )
    coordinator.add_argument(
        "--target", required=True, type=address, metavar="HOST:PORT", help="the coordinator"
    )
    coordinator.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        metavar="ID",
        help=f"the target's network id (default {DEFAULT_NETWORK_ID})",
    )
    coordinator.add_argument(
        "--keys",
        type=directory,
        metavar="DIR",
        help="a folder with validator.key, trainer.key and/or operator.key: keys on the "
        "target's allow-lists (workers are new keys the suite makes)",
    )
    coordinator.add_argument(
        "--restart-command",
        metavar="CMD",
        help="a shell command that restarts the target (same data and address); enables the "
        "restart cases",
    )
    coordinator.add_argument(
        "--replica",
        type=address,
        metavar="HOST:PORT",
        help="another replica of the target (same database): enables the cross-replica cases",
    )
    coordinator.add_argument(
        "--invite",
        type=_invite,
        metavar="POOL:TOKEN",
        help="an invite-only pool of the target and one of its tokens",
    )
    coordinator.add_argument(
        "--upload-quota-bytes",
        type=whole("bytes"),
        metavar="N",
        help="the target's upload_quota_bytes (enables the quota case; at most 64 MiB)",
    )
    coordinator.add_argument(
        "--max-message-bytes",
        type=whole("bytes"),
        default=16 << 20,
        metavar="N",
        help="the target's max_message_bytes (default 16 MiB)",
    )
    coordinator.add_argument(
        "--environment",
        default="arithmetic",
        metavar="NAME",
        help="an environment the target serves (default arithmetic)",
    )
    coordinator.add_argument(
        "--max-wait",
        type=seconds(1.0, 3600.0),
        default=30.0,
        metavar="SECONDS",
        help="longest the suite waits on the target's timers, e.g. lease expiry (default 30)",
    )
    coordinator.add_argument(
        "--timeout",
        type=seconds(0.1, 3600.0),
        default=15.0,
        metavar="SECONDS",
        help="per-call deadline (default 15)",
    )
    coordinator.add_argument(
        "--tls-ca",
        type=readable_file,
        metavar="FILE",
        help="PEM roots to verify the target's TLS certificate (enables TLS)",
    )
    coordinator.add_argument(
        "--tls-server-name", metavar="NAME", help="expected TLS server name (with --tls-ca)"
    )
    _common(coordinator)
    coordinator.set_defaults(handler=_coordinator)

    worker = commands.add_parser(
        "worker",
        help="run the worker suite against a worker program",
        description=(
            "Starts a harness network (reference coordinator, validator, trainer, operator; the "
            "tiny model), launches the worker under test with --command and drives scenarios."
        ),
    )
    worker.add_argument(
        "--command",
        required=True,
        metavar="CMD",
        help="the worker's command line, split as a shell would but run without one; {target} "
        "{network_id} {key} {data_dir} {python} are replaced",
    )
    worker.add_argument(
        "--work-dir",
        type=directory,
        metavar="DIR",
        help="where the harness keeps its files (default: a temporary folder)",
    )
    worker.add_argument(
        "--startup-timeout",
        type=seconds(1.0, 3600.0),
        default=120.0,
        metavar="SECONDS",
        help="how long the worker may take to register (default 120)",
    )
    _common(worker)
    worker.set_defaults(handler=_worker)

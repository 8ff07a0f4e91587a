"""``rollnet ledger``: verify, export and total the contribution ledger.

``verify`` recomputes every entry hash and checks every signed chain head, from a database or
from an export file, without trusting the coordinator; it exits 1 naming the first bad sequence
number when anything was tampered with, and 2 when the input cannot be read at all.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK = 0
EXIT_TAMPERED = 1
EXIT_UNREADABLE = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``ledger`` command group."""
    parser = subparsers.add_parser(
        "ledger",
        help="verify, export and total the contribution ledger",
        description="Verify, export and total the hash-chained contribution ledger.",
    )
    commands = parser.add_subparsers(dest="ledger_command", metavar="SUBCOMMAND", required=True)

    verify = commands.add_parser(
        "verify",
        help="recompute every hash and check every signed head",
        description=(
            "Recompute every entry hash and check every signed chain head. Exits 0 when the"
            " ledger is intact, 1 naming the first bad sequence number when it is not, 2 when"
            " the input cannot be read."
        ),
    )
    source = verify.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", metavar="URL", help="database URL (sqlite:///… or postgresql://…)")
    source.add_argument("--export", metavar="FILE", help="JSON Lines file from 'ledger export'")
    verify.add_argument(
        "--coordinator-key",
        metavar="HEX",
        help="pin the coordinator's Ed25519 public key (64 hex chars); without it, heads are"
        " checked against the keys stored with them",
    )
    verify.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="processes verifying an export in parallel (default: one per CPU for exports of"
        " 64 MB or more, else 1)",
    )
    verify.set_defaults(handler=_verify)

    export = commands.add_parser("export", help="write the ledger as JSON Lines")
    export.add_argument("--db", metavar="URL", required=True, help="database URL")
    export.add_argument("--out", metavar="FILE", required=True, help="output file")
    export.set_defaults(handler=_export)

    balances = commands.add_parser("balances", help="print per-node totals in work units")
    balances.add_argument("--db", metavar="URL", required=True, help="database URL")
    balances.set_defaults(handler=_balances)


def _verify(args: argparse.Namespace) -> int:
    from rollnet.ledger.export import verify_database
    from rollnet.ledger.verify import ExportFormatError, verify_export

    if args.jobs is not None and args.jobs < 1:
        print("--jobs must be at least 1", file=sys.stderr)
        return EXIT_UNREADABLE
    pinned: bytes | None = None
    if args.coordinator_key is not None:
        try:
            pinned = bytes.fromhex(args.coordinator_key)
        except ValueError:
            pinned = None
        if pinned is None or len(pinned) != 32:
            print("--coordinator-key must be 64 hex characters (32 bytes)", file=sys.stderr)
            return EXIT_UNREADABLE
    try:
        if args.export is not None:
            report = verify_export(args.export, pinned_key=pinned, workers=args.jobs)
        else:
            engine = _engine(args.db)
            try:
                report = verify_database(engine, pinned_key=pinned)
            finally:
                engine.dispose()
    except (OSError, ExportFormatError) as exc:
        print(f"cannot read the ledger: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except Exception as exc:
        if _is_database_error(exc):
            print(f"cannot read the ledger database: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        raise
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_TAMPERED


def _export(args: argparse.Namespace) -> int:
    from rollnet.ledger.export import export_jsonl

    engine = _engine(args.db)
    try:
        count = export_jsonl(engine, args.out)
    except Exception as exc:
        if _is_database_error(exc):
            print(f"cannot read the ledger database: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        raise
    finally:
        engine.dispose()
    print(f"exported {count} entries to {args.out}")
    return EXIT_OK


def _balances(args: argparse.Namespace) -> int:
    from rollnet.ledger.chain import balances
    from rollnet.ledger.engine import session_factory

    engine = _engine(args.db)
    try:
        with session_factory(engine).begin() as session:
            totals = balances(session)
    except Exception as exc:
        if _is_database_error(exc):
            print(f"cannot read the ledger database: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        raise
    finally:
        engine.dispose()
    width = max((len(str(total)) for total in totals.values()), default=1)
    for node_id, total in totals.items():
        print(f"{node_id}  {total:>{width}}")
    print(f"{len(totals)} nodes, {sum(totals.values())} work units in total")
    return EXIT_OK


def _engine(url: str) -> Any:
    from rollnet.ledger.engine import create_engine

    return create_engine(url)


def _is_database_error(exc: Exception) -> bool:
    from sqlalchemy.exc import SQLAlchemyError

    return isinstance(exc, SQLAlchemyError)

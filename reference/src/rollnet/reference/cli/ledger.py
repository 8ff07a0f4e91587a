"""``rollnet ledger``: verify, export and total the contribution ledger.

``verify`` recomputes every entry hash and checks every signed chain head, from a database or
from an export file, without trusting the coordinator; it exits 1 naming the first bad sequence
number when anything was tampered with, and 2 when the input cannot be read at all.

These commands only read: a database that does not exist is an error, never created (a SQLite
URL naming a missing file would otherwise make an empty database, and its directories, there).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollnet.reference.cli.errors import EXIT_ERROR, EXIT_OK, CliError
from rollnet.reference.cli.option_types import database_url, output_file, readable_file, whole

EXIT_TAMPERED = 1
EXIT_UNREADABLE = EXIT_ERROR


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``ledger`` command group."""
    parser = subparsers.add_parser(
        "ledger",
        help="verify, export and total the contribution ledger",
        description=(
            "Verify, export and total the hash-chained contribution ledger. The coordinator's "
            "SQLite ledger is DATA_DIR/rollnet.db: --db sqlite:///DATA_DIR/rollnet.db. These "
            "commands only read; a missing database is an error, never created."
        ),
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
    source.add_argument(
        "--db",
        metavar="URL",
        type=database_url,
        help="database URL (sqlite:///PATH or postgresql://USER@HOST:PORT/DB)",
    )
    source.add_argument(
        "--export", metavar="FILE", type=readable_file, help="JSON Lines file from 'ledger export'"
    )
    verify.add_argument(
        "--coordinator-key",
        metavar="HEX",
        help="pin the coordinator's Ed25519 public key (64 hex chars); without it, heads are"
        " checked against the keys stored with them",
    )
    verify.add_argument(
        "--jobs",
        type=whole("processes"),
        metavar="N",
        help="processes verifying an export in parallel (default: one per CPU for exports of"
        " 64 MB or more, else 1)",
    )
    verify.set_defaults(handler=_verify)

    export = commands.add_parser("export", help="write the ledger as JSON Lines")
    export.add_argument(
        "--db", metavar="URL", type=database_url, required=True, help="database URL"
    )
    export.add_argument(
        "--out",
        metavar="FILE",
        type=output_file,
        required=True,
        help="output file (its directory must exist)",
    )
    export.set_defaults(handler=_export)

    balances = commands.add_parser("balances", help="print per-node totals in work units")
    balances.add_argument(
        "--db", metavar="URL", type=database_url, required=True, help="database URL"
    )
    balances.set_defaults(handler=_balances)


def _verify(args: argparse.Namespace) -> int:
    from rollnet.ledger.export import verify_database
    from rollnet.ledger.verify import ExportFormatError, verify_export

    pinned: bytes | None = None
    if args.coordinator_key is not None:
        try:
            pinned = bytes.fromhex(args.coordinator_key)
        except ValueError:
            pinned = None
        if pinned is None or len(pinned) != 32:
            raise CliError(
                "--coordinator-key must be 64 hex characters (32 bytes): the coordinator's "
                "public_key_hex from 'rollnet keys show DATA_DIR/coordinator.key'"
            )
    if args.export is not None:
        try:
            report = verify_export(args.export, pinned_key=pinned, workers=args.jobs)
        except ExportFormatError as exc:
            raise CliError(f"cannot read the ledger export {args.export}: {exc}") from None
    else:
        with _existing_database(args.db) as engine:
            report = verify_database(engine, pinned_key=pinned)
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_TAMPERED


def _export(args: argparse.Namespace) -> int:
    from rollnet.ledger.export import export_jsonl

    with _existing_database(args.db) as engine:
        count = export_jsonl(engine, args.out)
    print(f"exported {count} entries to {args.out}")
    return EXIT_OK


def _balances(args: argparse.Namespace) -> int:
    from rollnet.ledger.chain import balances
    from rollnet.ledger.engine import read_only_session, session_factory

    with _existing_database(args.db) as engine, read_only_session(session_factory(engine)) as s:
        totals = balances(s)
    width = max((len(str(total)) for total in totals.values()), default=1)
    for node_id, total in totals.items():
        print(f"{node_id}  {total:>{width}}")
    print(f"{len(totals)} nodes, {sum(totals.values())} work units in total")
    return EXIT_OK


@contextmanager
def _existing_database(url: str) -> Iterator[Any]:
    """An engine on a ledger that must exist; database errors become one line naming it."""
    from sqlalchemy.exc import SQLAlchemyError

    from rollnet.ledger.engine import describe_database_error, open_existing

    engine = open_existing(url)
    try:
        yield engine
    except SQLAlchemyError as error:
        raise CliError(f"cannot read the ledger: {describe_database_error(error, url)}") from None
    finally:
        engine.dispose()

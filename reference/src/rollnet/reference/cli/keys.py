"""``rollnet keys``: create and inspect node keys (``generate``, ``show``)."""

from __future__ import annotations

import argparse
from typing import Any

from rollnet.reference.cli.errors import CliError
from rollnet.reference.cli.option_types import output_file
from rollnet.sdk import Identity, KeyFileError
from rollnet.sdk.identity import b64url_encode


def _describe(identity: Identity) -> str:
    # Never the private key: these lines are meant to be pasted into allow-lists and logs.
    return (
        f"node_id: {identity.node_id}\n"
        f"public_key: {b64url_encode(identity.public_key)}\n"
        f"public_key_hex: {identity.public_key.hex()}"
    )


def _generate(args: argparse.Namespace) -> int:
    identity = Identity.generate()
    try:
        identity.save(args.out, overwrite=args.force)
    except KeyFileError as exc:
        hint = " (pass --force to replace it)" if "already exists" in str(exc) else ""
        raise CliError(f"{exc}{hint}") from None
    print(f"wrote {args.out} (mode 0600)")
    print(_describe(identity))
    return 0


def _show(args: argparse.Namespace) -> int:
    print(_describe(Identity.load(args.file)))  # a KeyFileError is worded by the CLI
    return 0


def register(subparsers: Any) -> None:
    """Add the ``keys`` command group."""
    parser = subparsers.add_parser("keys", help="create and inspect Ed25519 node keys")
    commands = parser.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    generate = commands.add_parser(
        "generate", help="write a new key (PKCS#8 PEM, mode 0600) and print its node id"
    )
    generate.add_argument(
        "--out",
        required=True,
        type=output_file,
        help="key file to write (its directory must exist)",
    )
    generate.add_argument("--force", action="store_true", help="replace an existing file")
    generate.set_defaults(handler=_generate)
    show = commands.add_parser("show", help="print a key file's node id and public key")
    show.add_argument("file", help="key file to read")
    show.set_defaults(handler=_show)

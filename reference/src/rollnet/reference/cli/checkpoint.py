"""``rollnet checkpoint publish``: publish a model directory as a checkpoint (trainer key).

``rollnet trainer`` publishes its checkpoints by itself; this command publishes a model directory
by hand (a network's first checkpoint without a trainer, tests, scripts): the files of a Hugging
Face model directory are cut into shards, uploaded to the coordinator as blobs and described by a
signed manifest (see :mod:`rollnet.reference.checkpoint_publishing`). Exit codes: 0 published, 1
the coordinator refused (the reason is printed), 2 bad local input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rollnet.reference.cli.connection import connection_arguments, run_with_client
from rollnet.reference.cli.errors import EXIT_OK, CliError
from rollnet.reference.cli.option_types import whole
from rollnet.sdk import Identity, RollnetClient
from rollnet.v1 import common_pb2

_MIB = 1024 * 1024


def _publish(args: argparse.Namespace) -> int:
    from rollnet.reference.checkpoint_publishing import (
        CheckpointDirError,
        DeltaBase,
        model_files,
        publish_model_dir,
    )

    try:
        model_files(args.model)
    except CheckpointDirError as error:
        raise CliError(str(error)) from None
    delta_base = None
    if args.delta_from is not None:
        if args.delta_step is None or args.delta_step >= args.step:
            raise CliError(
                "--delta-from needs --delta-step N, the step of that directory (< --step)"
            )
        if not args.delta_from.is_dir():
            raise CliError(f"--delta-from {args.delta_from}: not a directory")
        delta_base = DeltaBase(args.delta_step, args.delta_from)

    async def action(client: RollnetClient, identity: Identity) -> int:
        published = await publish_model_dir(
            client,
            identity,
            args.model,
            args.step,
            args.network_id,
            shard_size=int(args.shard_mib * _MIB),
            delta_base=delta_base,
            origin_dir=args.origin_dir,
        )
        manifest = published.manifest
        summary = {
            "step": published.checkpoint.step,
            "files": len(manifest.files),
            "shards": published.shards_uploaded,
            "shards_already_present": published.shards_already_present,
            "bytes": published.bytes_uploaded,
            "flops_per_token": manifest.flops_per_token,
        }
        if args.json:
            print(json.dumps(summary))
        else:
            print(
                f"published step {summary['step']}: {summary['files']} files, "
                f"{summary['shards']} shards ({summary['shards_already_present']} already "
                f"stored), {summary['bytes']} bytes, flops_per_token {summary['flops_per_token']}"
            )
        return EXIT_OK

    return run_with_client(args, "checkpoint publish", common_pb2.ROLE_TRAINER, action)


def _shard_mib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not (value <= 2048 and int(value * _MIB) >= 1):  # NaN fails the comparisons too
        raise argparse.ArgumentTypeError(f"{text}: a shard is one byte to 2048 MiB")
    return value


def register(subparsers: Any) -> None:
    """Add the ``checkpoint`` command group."""
    parser = subparsers.add_parser(
        "checkpoint",
        help="publish model checkpoints (trainer key)",
        description="Publish checkpoints to a coordinator.",
    )
    commands = parser.add_subparsers(dest="checkpoint_command", metavar="COMMAND", required=True)
    publish = commands.add_parser(
        "publish",
        parents=[connection_arguments()],
        help="upload a model directory as shards and publish its signed manifest",
        description=(
            "Upload a Hugging Face model directory (config.json, tokenizer files, *.safetensors) "
            "as content-addressed shards and publish a manifest signed by --key, which must be "
            "on the coordinator's trainers allow-list. Steps must strictly increase; "
            "republishing the identical checkpoint is harmless."
        ),
    )
    publish.add_argument("--model", required=True, type=Path, metavar="DIR", help="model dir")
    publish.add_argument(
        "--step",
        required=True,
        # 0 is a valid first step (the initial model is published as checkpoint 0).
        type=whole("step", minimum=0, maximum=2**63 - 1),
        metavar="N",
        help="checkpoint step (0 for the initial model; steps must increase)",
    )
    publish.add_argument(
        "--shard-mib",
        type=_shard_mib,
        default=64.0,
        metavar="MIB",
        help="shard size in MiB (default 64)",
    )
    publish.add_argument(
        "--delta-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="the previous step's model dir: also ship each file as a lossless delta against it",
    )
    publish.add_argument(
        "--delta-step",
        type=whole("step", minimum=0, maximum=2**63 - 1),
        default=None,
        metavar="N",
        help="the step of --delta-from",
    )
    publish.add_argument(
        "--origin-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write every blob to DIR/blobs/ (serve it with rollnet relay --origin DIR)",
    )
    publish.add_argument("--json", action="store_true", help="print a JSON summary")
    publish.set_defaults(handler=_publish)

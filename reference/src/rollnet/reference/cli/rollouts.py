"""``rollnet rollouts``: ask a coordinator for rollouts and read the accepted ones, with a
trainer key and no code (``request``, ``stream``).

``request`` declares demand (RolloutService.RequestRollouts) and prints the tasks it became;
``stream`` prints accepted rollouts as JSON Lines (RolloutService.StreamRollouts) — the
validated reward, the tokens and who made them — until ``--count`` rollouts arrived or,
with ``--idle``, the stream stayed quiet that long. ``--key`` must be on the coordinator's
``trainers`` allow-list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from google.protobuf import json_format, struct_pb2

from rollnet.reference.cli.connection import connection_arguments, run_with_client
from rollnet.reference.cli.errors import EXIT_OK, CliError
from rollnet.reference.cli.option_types import seconds, whole
from rollnet.sdk import Identity, RollnetClient
from rollnet.v1 import common_pb2, rollout_pb2, rollout_service_pb2


def _environment_config(text: str) -> struct_pb2.Struct:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, as {"level": 1}')
    config = struct_pb2.Struct()
    config.update(data)
    return config


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.001 <= value <= 100.0:  # NaN fails too; the coordinator caps it further
        raise argparse.ArgumentTypeError(f"{text}: a temperature is from 0.001 up")
    return value


def _request(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        response = await client.rollouts.request_rollouts(
            rollout_service_pb2.RequestRolloutsRequest(
                request_id=args.request_id or "",
                rollout_step=args.step,
                environment=args.environment,
                environment_config=args.environment_config,
                prompt_count=args.prompts,
                samples_per_prompt=args.samples,
                sampling=common_pb2.SamplingParams(
                    temperature=args.temperature, max_new_tokens=args.max_new_tokens
                ),
                prompts_per_task=args.prompts_per_task,
            )
        )
        if args.json:
            print(
                json.dumps(
                    {
                        "task_ids": list(response.task_ids),
                        "checkpoint_step": response.checkpoint_step,
                    }
                )
            )
        else:
            print(
                f"{len(response.task_ids)} tasks queued for rollout step {args.step} "
                f"(checkpoint {response.checkpoint_step}): {' '.join(response.task_ids)}"
            )
        return EXIT_OK

    return run_with_client(args, "rollouts request", common_pb2.ROLE_TRAINER, action)


def rollout_line(accepted: rollout_pb2.AcceptedRollout, *, full: bool) -> dict[str, Any]:
    """One accepted rollout as JSON-ready data (the whole rollout and the validator's
    log-probabilities of its completion tokens only when ``full``)."""
    rollout = accepted.rollout
    line: dict[str, Any] = {
        "sequence": accepted.sequence,
        "task_id": accepted.task_id,
        "group_id": accepted.group_id,
        "node_id": accepted.node_id,
        "checkpoint_step": accepted.checkpoint_step,
        "rollout_step": accepted.rollout_step,
        "prompt_index": rollout.prompt_index,
        "completion_tokens": len(rollout.completion_token_ids),
        "validated_reward": (
            accepted.validated_reward.total if accepted.HasField("validated_reward") else None
        ),
    }
    if full:
        line["rollout"] = json_format.MessageToDict(rollout, preserving_proto_field_name=True)
        # A worker can shade its behaviour_logprobs under the validator's tolerance; these it
        # cannot (empty when the rollout was accepted without a spot check).
        line["validated_logprobs"] = list(accepted.validated_logprobs)
    return line


def _stream(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        seen = 0
        stream = client.rollouts.stream(
            args.after, min_checkpoint_step=args.min_checkpoint_step, timeout=None
        ).__aiter__()
        while args.count is None or seen < args.count:
            try:
                accepted = await asyncio.wait_for(anext(stream), args.idle)
            except TimeoutError:
                break  # quiet for --idle seconds
            except StopAsyncIteration:
                break
            print(json.dumps(rollout_line(accepted, full=args.full)), flush=True)
            seen += 1
        await stream.aclose()  # type: ignore[attr-defined]
        print(f"{seen} accepted rollouts", file=sys.stderr)
        return EXIT_OK

    if args.count is None and args.idle is None:
        raise CliError("give --count N, --idle SECONDS or both: the stream itself never ends")
    return run_with_client(args, "rollouts stream", common_pb2.ROLE_TRAINER, action)


def register(subparsers: Any) -> None:
    """Add the ``rollouts`` command group."""
    parser = subparsers.add_parser(
        "rollouts",
        help="request rollouts and stream accepted ones (trainer key)",
        description=(
            "Ask a coordinator for rollouts and read the accepted ones without writing code. "
            "--key must be on the coordinator's trainers allow-list."
        ),
    )
    commands = parser.add_subparsers(dest="rollouts_command", metavar="COMMAND", required=True)
    connection = connection_arguments()
    request = commands.add_parser(
        "request",
        parents=[connection],
        help="declare demand: the coordinator turns it into tasks for workers",
        description=(
            "Declare demand for rollouts: PROMPTS prompts (GRPO groups) of SAMPLES completions "
            "each, from ENVIRONMENT, split into tasks of --prompts-per-task prompts. Prints "
            "the created task ids. Repeating a --request-id creates nothing more."
        ),
    )
    request.add_argument("--environment", default="arithmetic", help="environment name")
    request.add_argument(
        "--environment-config",
        type=_environment_config,
        default=struct_pb2.Struct(),
        metavar="JSON",
        help="environment configuration as a JSON object (e.g. '{\"level\": 1}')",
    )
    request.add_argument(
        "--prompts", type=whole("prompts", maximum=100_000), default=8, help="prompts (default 8)"
    )
    request.add_argument(
        "--samples",
        type=whole("samples", maximum=4096),
        default=4,
        help="completions per prompt (default 4)",
    )
    request.add_argument(
        "--prompts-per-task",
        type=whole("prompts", maximum=100_000),
        default=1,
        help="prompts per task (default 1)",
    )
    request.add_argument(
        "--max-new-tokens",
        type=whole("tokens", maximum=1_000_000),
        default=32,
        help="length limit of a completion (default 32)",
    )
    request.add_argument(
        "--temperature", type=_temperature, default=1.0, help="sampling temperature (default 1)"
    )
    request.add_argument(
        "--step",
        type=whole("step", minimum=0, maximum=2**63 - 1),
        default=0,
        help="the trainer step the rollouts are for (default 0)",
    )
    request.add_argument("--request-id", help="idempotency key (a retry creates no more tasks)")
    request.add_argument("--json", action="store_true", help="print JSON")
    request.set_defaults(handler=_request)

    stream = commands.add_parser(
        "stream",
        parents=[connection],
        help="print accepted rollouts as JSON Lines",
        description=(
            "Print accepted rollouts as JSON Lines, oldest first: sequence, task, node, "
            "checkpoint and rollout step, completion length and validated reward (--full: the "
            "whole rollout and the validator's log-probabilities of its tokens). Stops after "
            "--count rollouts, or when none arrived for --idle seconds. Resume with --after "
            "LAST_SEQUENCE."
        ),
    )
    stream.add_argument(
        "--after",
        type=whole("sequence", minimum=0, maximum=2**64 - 1),
        default=0,
        help="start after this sequence number (default 0: from the beginning)",
    )
    stream.add_argument(
        "--min-checkpoint-step",
        type=whole("step", minimum=0, maximum=2**63 - 1),
        default=0,
        help="skip rollouts generated with an older checkpoint",
    )
    stream.add_argument("--count", type=whole("rollouts"), help="stop after N rollouts")
    stream.add_argument(
        "--idle",
        type=seconds(0.1, 86_400.0),
        help="stop when no rollout arrived for this many seconds",
    )
    stream.add_argument(
        "--full",
        action="store_true",
        help="include the whole rollout and the validated log-probabilities of its tokens",
    )
    stream.set_defaults(handler=_stream)

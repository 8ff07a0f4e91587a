"""What checking every field at the edge costs per call, next to what each call costs anyway.

For typical requests of the hot paths (a heartbeat, a pull, a commitment, a verdict) and for a
registration, measures in this process, interleaved, so that load on the machine hits all alike:

- parsing the request bytes (protobuf, which every call does),
- verifying an Ed25519 signature (which every signed call does),
- the coordinator's bounds check of the parsed request (``RequestBounds``).

    .venv/bin/python bench/request_bounds.py

Prints microseconds per call (medians over rounds) and the ratios; asserts nothing about time.
The end-to-end figures (heartbeats and lease cycles against an echo server) come from
``bench/coordinator_load.py``.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from google.protobuf import duration_pb2
from google.protobuf.message import Message

from rollnet.reference.coordinator.bounds import RequestBounds
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.sdk import Identity
from rollnet.sdk.identity import verify_signature
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.v1 import (
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

ROUNDS = 15
CALLS = 2_000


def typical_requests() -> dict[str, tuple[str, Message]]:
    """Name → (method path, request) as the SDK's worker and validator send them."""
    digest = bytes(range(32))
    rollouts = 8
    return {
        "Heartbeat": (
            "/rollnet.v1.NodeService/Heartbeat",
            node_service_pb2.HeartbeatRequest(
                activity=node_service_pb2.ACTIVITY_BUSY,
                held_lease_ids=["0123456789abcdef0123456789abcdef"] * 1,
                checkpoint_step=12,
                requested_interval=duration_pb2.Duration(seconds=10),
                metrics={"leases": 1.0, "outbox": 0.0},
            ),
        ),
        "PullTask": (
            "/rollnet.v1.TaskService/PullTask",
            task_service_pb2.PullTaskRequest(
                request_id="5f0c3b8e2a4d4c6f9e1b7a2d3c4e5f60",
                wait=duration_pb2.Duration(seconds=20),
            ),
        ),
        "SubmitCommitment": (
            "/rollnet.v1.CommitmentService/SubmitCommitment",
            commitment_service_pb2.SubmitCommitmentRequest(
                request_id="5f0c3b8e2a4d4c6f9e1b7a2d3c4e5f60",
                lease_id="0123456789abcdef0123456789abcdef",
                fencing_token=1,
                task_id="0123456789abcdef01234567",
                rollout_batch=common_pb2.BlobRef(blake3=digest, size=40_000),
                rollouts=[
                    commitment_pb2.RolloutDigest(
                        sampling_seed=2**40 + i,
                        proof_blake3=digest,
                        completion_tokens=200,
                        commitment_digest=digest,
                    )
                    for i in range(rollouts)
                ],
                claimed_work=commitment_pb2.WorkClaim(prefill_tokens=800, decode_tokens=1600),
                binding_digest=digest,
            ),
        ),
        "SubmitVerdict": (
            "/rollnet.v1.ValidationService/SubmitVerdict",
            validation_service_pb2.SubmitVerdictRequest(
                request_id="5f0c3b8e2a4d4c6f9e1b7a2d3c4e5f60",
                job_id="0123456789abcdef01234567",
                lease_id="0123456789abcdef0123456789abcdef",
                fencing_token=1,
                decision=validation_pb2.Verdict.DECISION_ACCEPT,
                checks=[
                    validation_pb2.CheckResult(
                        check=name,
                        passed=True,
                        figures={"max_exp_mismatches": 3.0, "mean_mantissa_error": 1.5},
                        rollout_index=i,
                    )
                    for i in range(rollouts)
                    for name in ("toploc", "sampling", "termination", "assigned_data", "reward")
                ],
                validated_rewards=[common_pb2.Reward(task_reward=1.0, total=1.0)] * rollouts,
                validated_work=commitment_pb2.WorkClaim(prefill_tokens=800, decode_tokens=1600),
                # The validator's own log-probability of each completion token, one list per
                # rollout: the longest lists a typical request carries.
                validated_logprobs=[
                    validation_pb2.ValidatedLogprobs(
                        logprobs=[-0.25 - t / 1000 for t in range(200)]
                    )
                    for _ in range(rollouts)
                ],
            ),
        ),
        "RegisterNode": (
            "/rollnet.v1.NodeService/RegisterNode",
            node_service_pb2.RegisterNodeRequest(
                request_id="5f0c3b8e2a4d4c6f9e1b7a2d3c4e5f60",
                public_key=digest,
                role=common_pb2.ROLE_WORKER,
                protocol_version=PROTOCOL_VERSION,
                software_version="rollnet-sdk/0.1.0",
                capabilities=node_pb2.Capabilities(
                    backends=["torch"], environments=["arithmetic"], dtypes=["float32"]
                ),
                hardware=node_pb2.HardwareReport(cpu_cores=16, memory_bytes=64 << 30),
            ),
        ),
    }


def per_call(action: Callable[[], object]) -> float:
    """CPU seconds per call of ``action`` over :data:`CALLS` calls (this thread's CPU time, so
    that other processes on the machine do not count)."""
    started = time.thread_time()
    for _ in range(CALLS):
        action()
    return (time.thread_time() - started) / CALLS


def measure(
    check: Callable[[Message], object], request: Message, verify: Callable[[], object]
) -> tuple[float, float, float]:
    """Median CPU microseconds per call: parse the request's bytes, verify a signature, check the
    parsed request's bounds; the three interleaved, round after round."""
    raw = request.SerializeToString()
    parse = functools.partial(type(request).FromString, raw)
    bounded = functools.partial(check, parse())
    actions: tuple[Callable[[], object], ...] = (parse, verify, bounded)
    samples: tuple[list[float], ...] = ([], [], [])
    for _ in range(ROUNDS):
        for action, found in zip(actions, samples, strict=True):
            found.append(per_call(action))
    parsed, verified, checked = (statistics.median(found) * 1e6 for found in samples)
    return parsed, verified, checked


def main() -> None:
    bounds = RequestBounds(CoordinatorConfig(data_dir=Path()))
    identity = Identity.generate()
    message = b"rollnet-request-v1\nnet\n/m\n0\n" + bytes(64)
    verify = functools.partial(
        verify_signature, identity.public_key, identity.sign(message), message
    )
    print(
        f"{CALLS:,} calls x {ROUNDS} rounds each, interleaved; medians of rounds, CPU us per call"
    )
    print(
        f"{'request':<18}{'bytes':>7}{'parse':>9}{'verify':>9}{'bounds':>9}"
        f"{'bounds/parse':>15}{'bounds/(parse+verify)':>24}"
    )
    for name, (method, request) in typical_requests().items():
        check = bounds.checker(method)
        assert check is not None
        assert not check(request), f"a typical {name} must be within bounds"
        parsed, verified, checked = measure(check, request, verify)
        print(
            f"{name:<18}{request.ByteSize():>7,}{parsed:>9.1f}{verified:>9.1f}{checked:>9.1f}"
            f"{checked / parsed:>14.2f}x{checked / (parsed + verified):>23.2f}x"
        )


if __name__ == "__main__":
    main()

"""The coordinator suite's cases: rollouts."""

from __future__ import annotations

import math

import grpc

from rollnet.sdk.conformance.coordinator._base import C, case, expect
from rollnet.sdk.conformance.target import REQUEST_ROLLOUTS, STREAM_ROLLOUTS, VERDICT, Target
from rollnet.v1 import rollout_service_pb2, validation_service_pb2


@case(
    "rollouts.request",
    "RequestRollouts: a retry creates no more tasks; bad sampling: INVALID_FIELDS",
)
async def rollouts_request(target: Target) -> None:
    trainer = await target.peer("trainer")
    step = await target.checkpoint(trainer)
    request = target.rollouts_request(2, 1, step)
    first = await trainer.call(
        REQUEST_ROLLOUTS, request, rollout_service_pb2.RequestRolloutsResponse
    )
    again = await trainer.call(
        REQUEST_ROLLOUTS, request, rollout_service_pb2.RequestRolloutsResponse
    )
    expect(list(again.task_ids) == list(first.task_ids), "a retry answered other task ids")
    bad = target.rollouts_request(1, 1, step)
    bad.sampling.temperature = math.nan
    await trainer.refused(
        REQUEST_ROLLOUTS, bad, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="sampling.temperature"
    )
    bad = target.rollouts_request(1, 0, step)
    await trainer.refused(
        REQUEST_ROLLOUTS, bad, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="samples_per_prompt"
    )
    bad = target.rollouts_request(8192, 2, step)
    bad.prompts_per_task = 4096  # 4,096 prompts x 2 samples: above 4,096 rollouts per task
    await trainer.refused(
        REQUEST_ROLLOUTS, bad, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="prompts_per_task"
    )
    # Finish the two tasks so that later cases lease their own.
    worker = await target.worker()
    for _ in first.task_ids:
        pulled = await worker.pull(wait=2.0)
        if pulled.HasField("task"):
            await target.commit(worker, target.work(worker, pulled.task, pulled.lease))


@case("rollouts.stream", "accepted rollouts reach StreamRollouts, with sequences, resumable")
async def rollouts_stream(target: Target) -> None:
    validator = await target.peer("validator")
    trainer = await target.peer("trainer")
    worker = await target.worker()
    work, response = await target.committed(worker)
    pulled = await target.job_for(validator, response.commitment.commitment_id)
    await validator.call(
        VERDICT, target.verdict(pulled, accept=True), validation_service_pb2.SubmitVerdictResponse
    )
    body = rollout_service_pb2.StreamRolloutsRequest(after_sequence=0).SerializeToString()
    call = target.wire.server_stream(
        STREAM_ROLLOUTS,
        body,
        trainer.headers(STREAM_ROLLOUTS, body),
        rollout_service_pb2.StreamRolloutsResponse,
        timeout=target.config.call_timeout,
    )
    mine = []
    last = 0
    try:
        async for item in call:
            rollout = item.rollout
            expect(rollout.sequence > last, f"sequence {rollout.sequence} after {last}")
            last = rollout.sequence
            if rollout.commitment_id == response.commitment.commitment_id:
                mine.append(rollout)
                if len(mine) == len(work.rollouts):
                    break
    except grpc.aio.AioRpcError as error:
        if error.code() != C.DEADLINE_EXCEEDED:
            raise
    finally:
        call.cancel()
    expect(
        len(mine) == len(work.rollouts),
        f"{len(mine)} of the accepted commitment's {len(work.rollouts)} rollouts were streamed",
    )
    expect(
        all(list(r.validated_logprobs) for r in mine),
        "a validated rollout streamed without validated_logprobs",
    )
    # Resuming after the first of them starts after it.
    body = rollout_service_pb2.StreamRolloutsRequest(
        after_sequence=mine[0].sequence
    ).SerializeToString()
    call = target.wire.server_stream(
        STREAM_ROLLOUTS,
        body,
        trainer.headers(STREAM_ROLLOUTS, body),
        rollout_service_pb2.StreamRolloutsResponse,
        timeout=target.config.call_timeout,
    )
    try:
        if len(mine) > 1:
            async for item in call:
                expect(
                    item.rollout.sequence > mine[0].sequence,
                    f"resumed after {mine[0].sequence}, got {item.rollout.sequence}",
                )
                break
    finally:
        call.cancel()

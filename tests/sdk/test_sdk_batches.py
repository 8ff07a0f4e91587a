"""``rollnet.sdk.batches``: sealing a rollout batch, and each rule :func:`check` refuses."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import blake3
import pytest

from rollnet.sdk import batches
from rollnet.sdk.batches import BatchProblem, BatchRule, BatchTerms
from rollnet.sdk.proofs.binding import LeaseBinding, derive_sampling_seed
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import commitment_pb2, rollout_pb2, task_pb2

BINDING = LeaseBinding(NETWORK_ID, "node-a", "task-1", "lease-1", 3)
TASK = task_pb2.Task(task_id="task-1", prompt_ids=[11, 12], samples_per_prompt=2, checkpoint_step=5)


def honest_rollouts() -> list[rollout_pb2.Rollout]:
    return [
        rollout_pb2.Rollout(
            prompt_index=prompt_index,
            prompt_id=prompt_id,
            sample_index=sample,
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            behaviour_logprobs=[-0.5, -0.5],
            sampling_seed=derive_sampling_seed(
                BINDING.network_id, BINDING.task_id, 2 * prompt_index + sample
            ),
            finish_reason=rollout_pb2.FINISH_REASON_EOS,
            toploc_proof=b"\x01" * 8,
        )
        for prompt_index, prompt_id in enumerate(TASK.prompt_ids)
        for sample in range(TASK.samples_per_prompt)
    ]


def sealed_parts() -> tuple[rollout_pb2.RolloutBatch, list[commitment_pb2.RolloutDigest]]:
    sealed = batches.seal(BINDING, TASK, honest_rollouts())
    return rollout_pb2.RolloutBatch.FromString(sealed.batch), list(sealed.request.rollouts)


def rules(problems: list[BatchProblem]) -> list[tuple[BatchRule, int | None]]:
    return [(p.rule, p.rollout_index) for p in problems]


def test_a_sealed_batch_passes_and_names_its_blob() -> None:
    sealed = batches.seal(BINDING, TASK, honest_rollouts())
    batch = rollout_pb2.RolloutBatch.FromString(sealed.batch)
    request = sealed.request
    assert request.rollout_batch.blake3 == blake3.blake3(sealed.batch).digest()
    assert request.rollout_batch.size == len(sealed.batch)
    assert request.binding_digest == batches.binding_digest(BINDING, request.rollout_batch.blake3)
    assert request.claimed_work.decode_tokens == 8
    assert (batch.task_id, batch.lease_id, batch.node_id) == ("task-1", "lease-1", "node-a")
    terms = replace(BatchTerms.of_task(TASK), max_new_tokens=2, prompt_lengths=(3, 3))
    assert batches.check(BINDING, terms, batch, request.rollouts) == []


def test_seal_batch_is_seal_with_the_binding_spelled_out() -> None:
    lease = task_pb2.Lease(lease_id="lease-1", fencing_token=3)
    old = batches.seal_batch(
        network_id=NETWORK_ID,
        node_id="node-a",
        task=TASK,
        lease=lease,
        rollouts=honest_rollouts(),
    )
    assert old == batches.seal(BINDING, TASK, honest_rollouts())


Breaker = Callable[[rollout_pb2.RolloutBatch, list[commitment_pb2.RolloutDigest]], None]


def _swap_order(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.rollouts[1].sample_index = 0


def _wrong_prompt(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.rollouts[2].prompt_id = 11


def _other_task(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.task_id = "task-2"


def _other_lease(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.fencing_token = 4


def _other_node(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.node_id = "node-b"


def _old_checkpoint(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.checkpoint_step = 4


def _seed_claimed(_: rollout_pb2.RolloutBatch, digests: list[commitment_pb2.RolloutDigest]) -> None:
    digests[3].sampling_seed += 1


def _seed_shopped(
    batch: rollout_pb2.RolloutBatch, digests: list[commitment_pb2.RolloutDigest]
) -> None:
    batch.rollouts[3].sampling_seed += 1
    digests[3].sampling_seed += 1


def _completion_claimed(
    _: rollout_pb2.RolloutBatch, digests: list[commitment_pb2.RolloutDigest]
) -> None:
    digests[0].completion_tokens = 1


def _proof_swapped(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.rollouts[1].toploc_proof = b"\x02" * 8


def _too_long(batch: rollout_pb2.RolloutBatch, digests: list[commitment_pb2.RolloutDigest]) -> None:
    batch.rollouts[0].completion_token_ids.append(6)
    digests[0].completion_tokens = 3


def _long_prompt(batch: rollout_pb2.RolloutBatch, _: list[commitment_pb2.RolloutDigest]) -> None:
    batch.rollouts[2].prompt_token_ids.append(4)


@pytest.mark.parametrize(
    ("breaker", "expected", "note"),
    [
        (_swap_order, [(BatchRule.ORDER, 1)], "rollouts[1].order"),
        (_wrong_prompt, [(BatchRule.PROMPT_ID, 2)], "rollouts[2].prompt_id"),
        (_other_task, [(BatchRule.TASK, None)], "task"),
        (_other_lease, [(BatchRule.LEASE, None)], "lease"),
        (_other_node, [(BatchRule.NODE, None)], "node"),
        (_old_checkpoint, [(BatchRule.CHECKPOINT_STEP, None)], "checkpoint_step"),
        (_seed_claimed, [(BatchRule.SEED_MISMATCH, 3)], "rollouts[3].digest"),
        (_seed_shopped, [(BatchRule.SEED_NOT_DERIVED, 3)], "rollouts[3].seed_not_derived"),
        (_completion_claimed, [(BatchRule.COMPLETION_TOKENS_MISMATCH, 0)], "rollouts[0].digest"),
        (_proof_swapped, [(BatchRule.PROOF_MISMATCH, 1)], "rollouts[1].digest"),
        (_too_long, [(BatchRule.COMPLETION_LENGTH, 0)], "rollouts[0].completion_length"),
        (_long_prompt, [(BatchRule.PROMPT_LENGTH, 2)], "rollouts[2].prompt_length"),
    ],
)
def test_check_refuses_each_broken_rule(
    breaker: Breaker, expected: list[tuple[BatchRule, int | None]], note: str
) -> None:
    batch, digests = sealed_parts()
    breaker(batch, digests)
    terms = replace(BatchTerms.of_task(TASK), max_new_tokens=2, prompt_lengths=(3, 3))
    problems = batches.check(BINDING, terms, batch, digests)
    assert rules(problems) == expected
    assert problems[0].note == note
    assert problems[0].message


def test_lengths_are_checked_only_where_the_terms_know_them() -> None:
    batch, digests = sealed_parts()
    _too_long(batch, digests)
    _long_prompt(batch, digests)
    assert batches.check(BINDING, BatchTerms.of_task(TASK), batch, digests) == []


def test_a_wrong_count_stops_the_check() -> None:
    batch, digests = sealed_parts()
    del batch.rollouts[3]
    batch.rollouts[0].prompt_id = 99  # not reported: the count already refuses the batch
    problems = batches.check(BINDING, BatchTerms.of_task(TASK), batch, digests)
    assert rules(problems) == [(BatchRule.ROLLOUT_COUNT, None)]
    assert "3 rollouts, task asks 4" in problems[0].message


def test_a_digest_list_of_another_length_is_refused() -> None:
    batch, digests = sealed_parts()
    problems = batches.check(BINDING, BatchTerms.of_task(TASK), batch, digests[:3])
    assert rules(problems) == [(BatchRule.DIGEST_COUNT, None)]
    assert problems[0].note == "commitment_rollouts"


def test_terms_for_another_task_are_refused() -> None:
    batch, digests = sealed_parts()
    terms = replace(BatchTerms.of_task(TASK), task_id="task-2")
    assert rules(batches.check(BINDING, terms, batch, digests)) == [(BatchRule.TASK, None)]


def test_limit_stops_after_that_many_problems() -> None:
    batch, digests = sealed_parts()
    for rollout in batch.rollouts:
        rollout.prompt_id = 99
    every = batches.check(BINDING, BatchTerms.of_task(TASK), batch, digests)
    assert len(every) == 4
    assert len(batches.check(BINDING, BatchTerms.of_task(TASK), batch, digests, limit=2)) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop(), "generator returned 3 rollouts, task asks 4"),
        (lambda r: r.reverse(), "the rollout order puts (0, 0) there"),
        (lambda r: setattr(r[1], "prompt_id", 12), "rollouts[1] answers prompt id 12"),
        (lambda r: setattr(r[2], "sampling_seed", 7), "rollouts[2].sampling_seed is not"),
    ],
)
def test_seal_refuses_what_check_refuses(
    change: Callable[[list[rollout_pb2.Rollout]], object], message: str
) -> None:
    rollouts = honest_rollouts()
    change(rollouts)
    with pytest.raises(ValueError, match=re.escape(message)):
        batches.seal(BINDING, TASK, rollouts)


def test_seal_refuses_another_task_than_the_leased_one() -> None:
    with pytest.raises(ValueError, match="is not the leased task"):
        batches.seal(replace(BINDING, task_id="task-2"), TASK, honest_rollouts())


def test_digests_for_another_lease_sign_over_it() -> None:
    sealed = batches.seal(BINDING, TASK, honest_rollouts())
    blob = sealed.request.rollout_batch.blake3
    other = replace(BINDING, lease_id="lease-0")
    replayed = batches.rollout_digests(other, blob, honest_rollouts())
    own = list(sealed.request.rollouts)
    assert [d.commitment_digest for d in replayed] != [d.commitment_digest for d in own]
    # Everything but the signed digest is the rollout's: check alone cannot tell a replay.
    batch = rollout_pb2.RolloutBatch.FromString(sealed.batch)
    assert batches.check(BINDING, BatchTerms.of_task(TASK), batch, replayed) == []

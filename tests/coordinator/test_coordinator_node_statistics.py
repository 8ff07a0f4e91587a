"""Per-node statistics on verdicts: refused unless shaped like the batch (one entry per rollout,
``tokens`` its completion length, the near-tie and EOS counts together at most tokens, the
log-probability dispersion over all tokens or none and at most 1 per token, with an ACCEPT
only), added up per worker in ``node_statistics`` at any task temperature, and a worker whose
evidence reaches a test's threshold (EOS steering and dispersion included) is ejected with the
test as its reason — its accepted work staying credited, nothing credited twice."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from coordinator_testing import (
    Parties,
    pull_and_commit,
    pull_job,
    request_tasks,
    running_parties,
    verdict_request,
)
from sqlalchemy import select
from sqlalchemy.engine import Engine

from rollnet.ledger.enums import EntryKind, NodeState
from rollnet.ledger.models import LedgerEntry, Node, NodeStatistics, Verdict
from rollnet.reference.coordinator import verdicts
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.sdk import ErrorReason, Identity, RollnetError
from rollnet.sdk.proofs.statistics import StatisticsPolicy
from rollnet.v1 import (
    common_pb2,
    rollout_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

ACCEPT = validation_pb2.Verdict.DECISION_ACCEPT
REJECT = validation_pb2.Verdict.DECISION_REJECT
# coordinator_testing.make_work: three completion tokens per rollout, two rollouts per job.
TOKENS = 3

# A policy a few verdicts can reach (the real ones need >= 1,000 tokens): same arithmetic.
QUICK = StatisticsPolicy(
    honest_loss_rate=0.002,
    alternative_loss_rate=0.03,
    logprob_drift=0.05,
    min_tokens=6,
    false_flag_probability=0.01,
    horizon_tokens=100,
    honest_dispersion=0.05,
    alternative_dispersion=0.5,
)


def stats(
    tokens: int = TOKENS,
    losses: int = 0,
    wins: int = 0,
    eos_losses: int = 0,
    eos_passes: int = 0,
    dispersion: float = 0.0,
    dispersion_tokens: int | None = None,
) -> validation_pb2.RolloutStatistics:
    return validation_pb2.RolloutStatistics(
        tokens=tokens,
        near_tie_losses=losses,
        near_tie_wins=wins,
        logprob_excess=-0.25,
        logprob_variance=1.5,
        eos_near_tie_losses=eos_losses,
        eos_near_tie_passes=eos_passes,
        logprob_dispersion=dispersion,
        dispersion_tokens=tokens if dispersion_tokens is None else dispersion_tokens,
    )


def verdict_on(
    job: validation_service_pb2.PullValidationJobResponse,
    entries: list[validation_pb2.RolloutStatistics],
    *,
    decision: validation_pb2.Verdict.Decision.ValueType = ACCEPT,
) -> validation_service_pb2.SubmitVerdictRequest:
    request = verdict_request(job, decision == ACCEPT, "TOKEN_NOT_SAMPLED")
    request.rollout_statistics.extend(entries)
    return request


def statistics_row(engine: Engine, node_id: str) -> NodeStatistics | None:
    with engine.connect() as conn:
        row = conn.execute(
            select(NodeStatistics).where(NodeStatistics.node_id == node_id)
        ).one_or_none()
    return None if row is None else NodeStatistics(**row._mapping)


def node(engine: Engine, node_id: str) -> tuple[NodeState, str]:
    with engine.connect() as conn:
        state, reason = conn.execute(
            select(Node.state, Node.state_reason).where(Node.id == node_id)
        ).one()
    return state, reason


def credits(engine: Engine, node_id: str) -> list[str]:
    """The commitment of each credit entry of ``node_id``."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(LedgerEntry.commitment_id).where(
                LedgerEntry.node_id == node_id, LedgerEntry.kind == EntryKind.CREDIT
            )
        )
        return [str(c) for c in rows.scalars()]


@pytest.fixture
async def swarm(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Parties]:
    monkeypatch.setattr(verdicts, "statistics_policy_for", lambda dtype: QUICK)
    # Every commitment validated (no unchecked credit), one reject never ejects.
    config = with_overrides(coordinator_config, trusted_streak=1000, eject_after_rejects=1000)
    async with running_parties(
        config, trainer_identity, validator_identity, tokenizer=True
    ) as parties:
        yield parties


async def test_misshapen_statistics_are_refused_and_nothing_is_recorded(swarm: Parties) -> None:
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 1, samples_per_prompt=2)
    await pull_and_commit(client, worker, tokenizer=True)
    job = await pull_job(validator)
    cases: list[tuple[list[validation_pb2.RolloutStatistics], str, str]] = [
        ([stats()], "rollout_statistics", "length 1, but the batch has 2 rollouts"),
        ([stats(), stats(), stats()], "rollout_statistics", "length 3, but the batch has 2"),
        ([stats(), stats(tokens=2)], "rollout_statistics[1].tokens", "2, but rollout 1 has 3"),
        ([stats(losses=2, wins=2), stats()], "rollout_statistics[0]", "exceed tokens = 3"),
        ([stats(), stats(wins=2, eos_passes=2)], "rollout_statistics[1]", "exceed tokens = 3"),
        ([stats(eos_losses=-1), stats()], "rollout_statistics[0].eos_near_tie_losses", "outside"),
        # The field's own bounds (at the edge): counts never negative, variance at least 0.
        ([stats(), stats(losses=-1)], "rollout_statistics[1].near_tie_losses", "outside"),
        (
            [stats(dispersion_tokens=2), stats()],
            "rollout_statistics[0].dispersion_tokens",
            "2, but the entry summarizes 3 tokens",
        ),
        (
            [stats(), stats(dispersion=3.5)],
            "rollout_statistics[1].logprob_dispersion",
            "each of its 3 tokens adds at most 1",
        ),
        ([stats(dispersion=-0.5), stats()], "rollout_statistics[0].logprob_dispersion", "is not"),
    ]
    for entries, field, why in cases:
        with pytest.raises(RollnetError) as caught:
            await validator.validation.submit_verdict(verdict_on(job, entries))
        error = caught.value
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT, field
        assert error.reason == ErrorReason.INVALID_FIELDS
        violations = {v.field: v.description for v in error.field_violations}
        assert field in violations, (field, violations)
        assert why in violations[field], (why, violations[field])
    with pytest.raises(RollnetError) as caught:
        await validator.validation.submit_verdict(
            verdict_on(job, [stats(), stats()], decision=REJECT)
        )
    assert "only an ACCEPT" in caught.value.field_violations[0].description
    with engine.connect() as conn:
        assert conn.execute(select(Verdict.id)).all() == []
    assert statistics_row(engine, worker.node_id) is None
    entries = [stats(wins=1, dispersion=0.25), stats(wins=2, dispersion=0.0, dispersion_tokens=0)]
    await validator.validation.submit_verdict(verdict_on(job, entries))
    row = statistics_row(engine, worker.node_id)
    assert row is not None
    assert (row.tokens, row.near_tie_losses, row.near_tie_wins) == (6, 0, 3)
    assert row.logprob_dispersion == pytest.approx(0.25)
    assert row.dispersion_tokens == 3
    assert row.dispersion_cusum == 0.0  # 0.25 over 3 tokens: a negative llr, the CUSUM stays 0
    assert row.logprob_excess == pytest.approx(-0.5)
    assert row.logprob_variance == pytest.approx(3.0)
    assert row.flagged_at is None


async def test_a_worker_whose_evidence_reaches_the_threshold_is_ejected(swarm: Parties) -> None:
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 4, samples_per_prompt=2)
    # Honest-looking evidence first: wins only, no flag, the work credited.
    await pull_and_commit(client, worker, tokenizer=True)
    await validator.validation.submit_verdict(
        verdict_on(await pull_job(validator), [stats(wins=3), stats(wins=3)])
    )
    assert node(engine, worker.node_id)[0] is not NodeState.EJECTED
    # Then near-tie losses: each is worth ln(0.03 / 0.002) = 2.7 nats against a threshold of
    # ln(100 * 5 / 0.01) = 10.8, so the second such verdict flags the node.
    for _ in range(2):
        await pull_and_commit(client, worker, tokenizer=True)
        job = await pull_job(validator)
        await validator.validation.submit_verdict(
            verdict_on(job, [stats(losses=2, wins=0), stats(losses=1, wins=0)])
        )
    state, reason = node(engine, worker.node_id)
    assert state is NodeState.EJECTED
    assert reason.startswith("per-node statistics: near_tie test"), reason
    assert "after 18 tokens" in reason
    row = statistics_row(engine, worker.node_id)
    assert row is not None
    assert row.flagged_at is not None
    assert row.flagged_test == "near_tie"
    assert (row.tokens, row.near_tie_losses, row.near_tie_wins) == (18, 6, 6)
    # Every verdict's work was accepted and is credited once: the flagging one too.
    with engine.connect() as conn:
        commitments = conn.execute(select(Verdict.commitment_id)).scalars().all()
    assert sorted(credits(engine, worker.node_id)) == sorted(commitments)
    assert len(commitments) == 3


async def test_eos_near_tie_losses_eject_a_worker_at_a_low_temperature(swarm: Parties) -> None:
    """EOS steering at T = 0.05: statistics count at every admitted temperature."""
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await trainer.rollouts.request_rollouts(
        rollout_service_pb2.RequestRolloutsRequest(
            rollout_step=1,
            environment="arithmetic",
            prompt_count=2,
            samples_per_prompt=2,
            sampling=common_pb2.SamplingParams(temperature=0.05, max_new_tokens=8),
            prompts_per_task=1,
        )
    )
    # Each EOS loss is worth ln(0.2 / 0.002) = 4.6 nats against 10.8: the second verdict flags.
    for count in range(1, 3):
        await pull_and_commit(client, worker, tokenizer=True)
        job = await pull_job(validator)
        assert job.job.task.sampling.temperature == pytest.approx(0.05)
        await validator.validation.submit_verdict(
            verdict_on(job, [stats(eos_losses=1), stats(eos_losses=1, eos_passes=1)])
        )
        state, reason = node(engine, worker.node_id)
        assert (state is NodeState.EJECTED) == (count == 2), (count, reason)
    assert reason.startswith("per-node statistics: eos test"), reason
    row = statistics_row(engine, worker.node_id)
    assert row is not None
    assert (row.tokens, row.near_tie_losses, row.near_tie_wins) == (12, 0, 0)
    assert row.flagged_test == "eos"
    assert (row.eos_near_tie_losses, row.eos_near_tie_passes) == (4, 2)
    assert row.eos_cusum >= QUICK.flag_threshold
    assert row.near_tie_cusum == 0.0


async def test_a_dispersed_worker_is_ejected_by_the_dispersion_test(swarm: Parties) -> None:
    """Log-probabilities far from the validator's on every token (a cheaper model): each token
    at the cap is worth ln(0.5 / 0.05) = 2.3 nats against 10.8, so the second verdict's six
    tokens flag the node after a first verdict close to the validator's."""
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 2, samples_per_prompt=2)
    for count, dispersion in ((1, 0.01), (2, 3.0)):
        await pull_and_commit(client, worker, tokenizer=True)
        job = await pull_job(validator)
        entries = [stats(wins=1, dispersion=dispersion), stats(dispersion=dispersion)]
        await validator.validation.submit_verdict(verdict_on(job, entries))
        state, reason = node(engine, worker.node_id)
        assert (state is NodeState.EJECTED) == (count == 2), (count, reason)
    assert reason.startswith("per-node statistics: dispersion test"), reason
    row = statistics_row(engine, worker.node_id)
    assert row is not None
    assert row.flagged_test == "dispersion"
    assert row.dispersion_tokens == 12
    assert row.logprob_dispersion == pytest.approx(6.02)
    assert row.dispersion_cusum >= QUICK.flag_threshold
    assert row.near_tie_cusum == 0.0
    with engine.connect() as conn:
        commitments = conn.execute(select(Verdict.commitment_id)).scalars().all()
    assert sorted(credits(engine, worker.node_id)) == sorted(commitments)

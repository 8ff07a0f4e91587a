"""Read side of the ledger: entries, balances, signed heads and the accepted-rollout stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, chain, tasks, validation
from rollnet.ledger.enums import EntryKind
from rollnet.reference.coordinator.context import CoordinatorContext, wait_for
from rollnet.reference.coordinator.serde import entry_to_proto, timestamp
from rollnet.v1 import common_pb2, ledger_pb2, ledger_service_pb2, rollout_pb2

# AcceptedRollout.sequence = ledger sequence of the credit entry << 16 | rollout index.
ROLLOUT_INDEX_BITS = 16


class LedgerDesk:
    """LedgerService and RolloutService.StreamRollouts."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    async def list_entries(
        self, request: ledger_service_pb2.ListEntriesRequest
    ) -> ledger_service_pb2.ListEntriesResponse:
        """A page of entries in sequence order."""
        limit = min(request.page_size or 100, 1000)

        def work(session: Session) -> ledger_service_pb2.ListEntriesResponse:
            entries = chain.list_entries(
                session,
                after_sequence=request.after_sequence,
                limit=limit,
                node_id=request.node_id or None,
            )
            tip = chain.chain_tip(session)
            return ledger_service_pb2.ListEntriesResponse(
                entries=[entry_to_proto(e) for e in entries],
                head_sequence=tip.sequence,
            )

        return await self.ctx.run_read(work)

    async def balance(self, node_id: str) -> ledger_service_pb2.GetBalanceResponse:
        """A node's totals."""

        def work(session: Session) -> ledger_service_pb2.GetBalanceResponse:
            totals = chain.node_totals(session, node_id)
            return ledger_service_pb2.GetBalanceResponse(
                node_id=node_id,
                balance=totals.balance,
                credited=totals.credited,
                slashed=totals.slashed,
                entry_count=totals.entry_count,
            )

        return await self.ctx.run_read(work)

    async def chain_head(self, *, fresh: bool) -> ledger_service_pb2.GetChainHeadResponse:
        """The newest signed head, signing one over the current tip when ``fresh``."""
        key = self.ctx.identity.private_key
        network = self.ctx.config.network_id

        def work(session: Session) -> ledger_service_pb2.GetChainHeadResponse:
            head = (
                chain.sign_chain_head(session, key, network, now=self.ctx.clock())
                if fresh
                else chain.latest_signed_head(session, network)
            )
            response = ledger_service_pb2.GetChainHeadResponse()
            if head is not None:
                response.head.CopyFrom(
                    ledger_pb2.ChainHead(
                        network_id=head.network_id,
                        sequence=head.sequence,
                        head_hash=head.head_hash,
                        signed_at=timestamp(head.signed_at),
                        coordinator_public_key=head.signer_public_key,
                        signature=head.signature,
                    )
                )
            return response

        return await self.ctx.run_in_transaction(work)

    async def sign_head(self) -> None:
        """Sign the current tip (periodic; a no-op when the chain did not move)."""
        key = self.ctx.identity.private_key
        network = self.ctx.config.network_id

        def work(session: Session) -> None:
            chain.sign_chain_head(session, key, network, now=self.ctx.clock())

        await self.ctx.run_in_transaction(work)

    async def accepted_rollouts(
        self, after_sequence: int, min_checkpoint_step: int
    ) -> AsyncIterator[rollout_pb2.AcceptedRollout]:
        """Every rollout of every credited commitment after ``after_sequence``, live."""
        entry_after = after_sequence >> ROLLOUT_INDEX_BITS
        index_after = after_sequence & ((1 << ROLLOUT_INDEX_BITS) - 1) if after_sequence else -1
        while True:

            def work(session: Session, after: int = entry_after) -> list[tuple[int, Any]]:
                found = []
                for entry in chain.list_entries(
                    session, after_sequence=after, limit=100, kind=EntryKind.CREDIT
                ):
                    commitment = artifacts.get_commitment(session, entry.commitment_id or "")
                    if commitment is None:
                        continue
                    task = tasks.get_task(session, commitment.task_id)
                    verdict = validation.get_verdict_for_commitment(session, commitment.id)
                    rewards = verdict.check_figures.get("validated_rewards", []) if verdict else []
                    logprobs = (
                        validation.unpack_logprobs(verdict.validated_logprobs)
                        if verdict is not None and verdict.validated_logprobs is not None
                        else []
                    )
                    found.append((entry.sequence, (commitment, task, rewards, logprobs)))
                return found

            batch = await self.ctx.run_read(work)
            for sequence, (commitment, task, rewards, logprobs) in batch:
                entry_after = sequence
                if task is None or task.checkpoint_step < min_checkpoint_step:
                    continue
                _, data = self.ctx.blobs.read_range(
                    bytes.fromhex(commitment.rollout_blob_hash), 0, 0
                )
                parsed = rollout_pb2.RolloutBatch.FromString(data)
                # Fields unknown to this schema were never interpreted by a validator: drop them
                # (recursively, sub-messages too) so a worker cannot pass them to the trainer.
                parsed.DiscardUnknownFields()
                rollouts = parsed.rollouts
                for index, rollout in enumerate(rollouts):
                    if sequence == after_sequence >> ROLLOUT_INDEX_BITS and index <= index_after:
                        continue
                    accepted = rollout_pb2.AcceptedRollout(
                        sequence=(sequence << ROLLOUT_INDEX_BITS) | index,
                        task_id=commitment.task_id,
                        commitment_id=commitment.id,
                        node_id=commitment.node_id,
                        checkpoint_step=task.checkpoint_step,
                        rollout_step=int(task.sampling.get("rollout_step", 0)),
                        rollout=rollout,
                        group_id=f"{commitment.task_id}/{rollout.prompt_index}",
                    )
                    if index < len(rewards):
                        task_reward, penalty, total = rewards[index]
                        accepted.validated_reward.CopyFrom(
                            common_pb2.Reward(
                                task_reward=task_reward, length_penalty=penalty, total=total
                            )
                        )
                    if index < len(logprobs):
                        # The validator's, never the worker's: see AcceptedRollout.
                        accepted.validated_logprobs.extend(logprobs[index])
                    yield accepted
            if not batch:
                if self.ctx.signals.stopping:
                    return  # the stream ends; the trainer resumes after its last sequence
                await wait_for(self.ctx.signals.rollouts_accepted, 1.0)

"""What the copy index adds to recording a commitment on the coordinator's database.

Baseline: one transaction that records the batch's blob and the commitment (the prepared
inserts of the SubmitCommitment path), committed to a SQLite file. Variant: the same plus the
copy check (``copies.originals``) and the index insert
(``fingerprints.record_fingerprints``) for its rollouts. The index starts with ``--indexed``
fingerprints; the two variants run alternately, ``--rounds`` times, and the ratio of their
medians is printed. A third variant repeats, in half of each batch's rollouts, a likely
completion that a quarter of the index already holds (a short answer honest workers give again
and again): its cost must not grow with how often the answer recurs. Fingerprinting the
rollouts (BLAKE3 of their tokens) is measured apart.
Run: ``.venv/bin/python bench/copy_index_cost.py``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from datetime import UTC, datetime

from sqlalchemy import create_engine, insert
from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, fingerprints
from rollnet.ledger.artifacts import NewCommitment
from rollnet.ledger.fingerprints import Fingerprint
from rollnet.ledger.models import Base, RolloutFingerprint
from rollnet.reference.coordinator import copies
from rollnet.v1 import rollout_pb2

NOW = datetime(2026, 12, 2, tzinfo=UTC)
#: The digests of a likely completion of one prompt that honest workers keep giving.
RECURRING = bytes(range(32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=32, help="rollouts per commitment")
    parser.add_argument("--indexed", type=int, default=200_000, help="fingerprints already there")
    parser.add_argument("--commitments", type=int, default=100, help="commitments per round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="rollnet-copy-index-")
    engine = create_engine(f"sqlite:///{directory}/bench.db")
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.execute(
            insert(RolloutFingerprint),
            [
                {
                    "commitment_id": f"old-{i // args.rollouts}",
                    "rollout_index": i % args.rollouts,
                    "node_id": "n" * 32,
                    "tokens_blake3": RECURRING if i % 4 == 0 else os.urandom(32),
                    "completion_blake3": RECURRING if i % 4 == 0 else os.urandom(32),
                    "logprob_sum": -1.0 if i % 4 == 0 else -5.0,
                }
                for i in range(args.indexed)
            ],
        )

    def prints(recurring: bool) -> list[Fingerprint]:
        return [
            Fingerprint(i, RECURRING, RECURRING, -1.0)
            if recurring and i % 2 == 0
            else Fingerprint(i, os.urandom(32), os.urandom(32), -30.0)
            for i in range(args.rollouts)
        ]

    def commit(variant: str) -> float:
        with_index = variant != "base"
        started = time.perf_counter()
        for _ in range(args.commitments):
            commitment_id = secrets.token_hex(12)
            blob = secrets.token_hex(32)
            batch_prints = prints(variant == "recurring")
            with Session(engine) as session, session.begin():
                artifacts.record_blob(
                    session, blake3_hex=blob, size=1000, location="x", uploader_id=None, now=NOW
                )
                if with_index:
                    found = copies.originals(session, batch_prints)
                    # The recurring answer is likely: a repeat, not a copy. (The index's rows
                    # name no commitment, so none is live; the reads are what is measured.)
                    assert not copies.find_copies(batch_prints, found)
                artifacts.record_commitment(
                    session,
                    NewCommitment(
                        commitment_id=commitment_id,
                        task_id="t-" + commitment_id,
                        node_id="n" * 32,
                        lease_id="l",
                        fencing_token=1,
                        rollout_blob_hash=blob,
                        proof_blob_hash=None,
                        sampling_seed=1,
                        claimed_work=1,
                        request_id="",
                        signature=bytes(64),
                    ),
                    now=NOW,
                )
                if with_index:
                    fingerprints.record_fingerprints(session, commitment_id, "n" * 32, batch_prints)
        commitments: int = args.commitments
        return (time.perf_counter() - started) / commitments

    variants = ("base", "index", "recurring")
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for _ in range(args.rounds):
        for variant in variants:
            times[variant].append(commit(variant))
    base, indexed, recurring = (statistics.median(times[v]) for v in variants)
    rollout = rollout_pb2.Rollout(
        prompt_token_ids=list(range(30)),
        completion_token_ids=list(range(12)),
        behaviour_logprobs=[-0.5] * 12,
    )
    batch = rollout_pb2.RolloutBatch(rollouts=[rollout] * args.rollouts)
    started = time.perf_counter()
    for _ in range(100):
        copies.fingerprints(batch)
    fingerprinting = (time.perf_counter() - started) / 100
    print(
        f"per commitment of {args.rollouts} rollouts, {args.indexed} fingerprints indexed, "
        f"SQLite file, median of {args.rounds} alternating rounds of {args.commitments}:"
    )
    print(f"  blob + commitment:                  {base * 1e3:.2f} ms")
    print(f"  + copy check and index insert:      {indexed * 1e3:.2f} ms  ({indexed / base:.2f}x)")
    print(
        f"  the same, half the batch a likely answer indexed {args.indexed // 4} times: "
        f"{recurring * 1e3:.2f} ms  ({recurring / base:.2f}x)"
    )
    print(f"  fingerprinting (42-token rollouts): {fingerprinting * 1e3:.2f} ms")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

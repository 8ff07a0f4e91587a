"""The database's replay cache: a nonce is claimed once; in a batch of calls the replays are
those claimed before and the second of two with one nonce."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger.nonces import claim_nonces, replayed_calls


def test_a_batch_names_its_replays_earlier_ones_and_repeats_within_it(
    sessions: sessionmaker[Session],
) -> None:
    first, second, third = ("node-a", "n1", 1_000), ("node-a", "n2", 1_000), ("node-b", "n1", 5)
    with sessions.begin() as session:
        assert claim_nonces(session, [first]) == {first}
    with sessions.begin() as session:
        # None: a call without a nonce, never a replay.
        batch = [first, None, second, third, second, None]
        assert replayed_calls(session, batch) == {0, 4}
    with sessions.begin() as session:
        assert replayed_calls(session, [third, None]) == {0}
        assert replayed_calls(session, []) == set()
        assert claim_nonces(session, [first, second, third]) == set()

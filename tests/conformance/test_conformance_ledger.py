"""The suite's own ledger check, written from docs/ledger.md, reproduces the document's worked
example byte for byte and catches a changed entry, a broken link and a bad head signature."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from rollnet.sdk import Identity
from rollnet.sdk.conformance.ledger import canonical_bytes, entry_hash, head_message, verify_chain
from rollnet.v1 import ledger_pb2

NODE = "0123456789abcdef0123456789abcdef"
SEED = bytes(range(32))


def _entry(
    sequence: int,
    micros: int,
    kind: ledger_pb2.LedgerEntry.Kind.ValueType,
    amount: int,
    *,
    commitment_id: str = "",
    verdict_id: str = "",
    memo: str = "",
) -> ledger_pb2.LedgerEntry:
    return ledger_pb2.LedgerEntry(
        sequence=sequence,
        recorded_at=timestamp_pb2.Timestamp(
            seconds=micros // 1_000_000, nanos=micros % 1_000_000 * 1000
        ),
        node_id=NODE,
        kind=kind,
        amount=amount,
        commitment_id=commitment_id,
        verdict_id=verdict_id,
        memo=memo,
    )


def _chain() -> list[ledger_pb2.LedgerEntry]:
    first = _entry(
        1,
        1767225600000000,
        ledger_pb2.LedgerEntry.KIND_CREDIT,
        1500,
        commitment_id="cmt-1",
        verdict_id="vrd-1",
    )
    second = _entry(
        2,
        1767225600000001,
        ledger_pb2.LedgerEntry.KIND_SLASH,
        -300,
        verdict_id="vrd-2",
        memo="rejected: toploc",
    )
    prev = b"\x00" * 32
    for entry in (first, second):
        entry.prev_hash = prev
        entry.entry_hash = prev = entry_hash(prev, entry)
    return [first, second]


def test_the_worked_example() -> None:
    first, second = _chain()
    assert canonical_bytes(first).hex() == (
        "726f6c6c6e65742e6c65646765722e656e747279010000000000000001000647484620400000000020"
        "30313233343536373839616263646566303132333435363738396162636465660000000663726564"
        "697400000000000005dc0100000005636d742d3101000000057672642d3100000000"
    )
    assert first.entry_hash.hex() == (
        "fec5a2e6a9e91d9ac8d4a604767cd4831a1e160d17175a955d63428bb2c4076c"
    )
    assert second.entry_hash.hex() == (
        "42fa6b444f7422f7273488b40c5fa275f5d19a52ab4dfdde7eb644dcfe1d8843"
    )
    key = Identity.from_seed(SEED)
    message = head_message("rollnet-demo", 2, second.entry_hash)
    assert key.sign(message).hex() == (
        "74dea856f302a752df264dcf22b7a47b4335187aa86b9b074f990805e7cacf951a7c5308715648a6"
        "3826ab83f28a819f0bef35d5c6de45e5a8b3df1a705ec400"
    )


def test_verify_chain_finds_each_break() -> None:
    key = Identity.from_seed(SEED)
    entries = _chain()

    def head(
        sequence: int, head_hash: bytes, signature: bytes | None = None
    ) -> ledger_pb2.ChainHead:
        message = head_message("rollnet-demo", sequence, head_hash)
        return ledger_pb2.ChainHead(
            network_id="rollnet-demo",
            sequence=sequence,
            head_hash=head_hash,
            coordinator_public_key=key.public_key,
            signature=key.sign(message) if signature is None else signature,
        )

    good = head(2, entries[1].entry_hash)
    assert verify_chain(entries, good, "rollnet-demo", key.public_key) is None
    changed = _chain()
    changed[0].amount = 1501
    assert "entry_hash" in (verify_chain(changed, good, "rollnet-demo", key.public_key) or "")
    relinked = _chain()
    relinked[1].prev_hash = b"\x01" * 32
    assert "prev_hash" in (verify_chain(relinked, good, "rollnet-demo", key.public_key) or "")
    forged = head(2, entries[1].entry_hash, signature=b"\x00" * 64)
    assert "signature" in (verify_chain(entries, forged, "rollnet-demo", key.public_key) or "")
    assert "network" in (verify_chain(entries, good, "rollnet-other", key.public_key) or "")

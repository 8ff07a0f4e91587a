"""The stored form of a verdict's validated log-probabilities: float32 values round-trip exactly,
rollouts keep their order and lengths (empty ones too), and damaged bytes are refused."""

from __future__ import annotations

import numpy as np
import pytest

from rollnet.ledger.validation import pack_logprobs, unpack_logprobs


def test_round_trip_keeps_every_float32_value_and_length() -> None:
    rng = np.random.default_rng(0)
    rows = [(-rng.exponential(2.0, size=n)).astype(np.float32).tolist() for n in (5, 0, 1, 300)]
    rows[0][0] = -0.0
    rows[3][7] = float(np.finfo(np.float32).min)
    data = pack_logprobs(rows)
    # 4 bytes per value, 4 per rollout, 4 for the count.
    assert len(data) == 4 * (1 + len(rows) + sum(len(r) for r in rows))
    assert unpack_logprobs(data) == rows
    assert unpack_logprobs(pack_logprobs([])) == []


def test_values_are_stored_little_endian() -> None:
    assert (
        pack_logprobs([[-1.0]]) == b"\x01\x00\x00\x00" + b"\x01\x00\x00\x00" + b"\x00\x00\x80\xbf"
    )


@pytest.mark.parametrize("cut", [-1, -4, 2, 4, -20])
def test_damaged_bytes_are_refused(cut: int) -> None:
    data = pack_logprobs([[-0.5, -0.25], [-1.0]])
    damaged = data[:cut] if cut < 0 else data + b"\x00" * cut
    with pytest.raises(ValueError, match="truncated or padded"):
        unpack_logprobs(damaged)

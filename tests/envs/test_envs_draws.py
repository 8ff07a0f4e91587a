"""The BLAKE3 draw stream follows its written specification exactly."""

from __future__ import annotations

import struct
from collections import Counter

import blake3
import pytest

from rollnet.reference.envs import MAX_PROMPT_ID, DrawStream
from rollnet.sdk.domains import DRAW_DOMAIN


def _words_from_spec(
    environment: str, seed: int, prompt_id: int, label: str, count: int
) -> list[int]:
    """The stream as docs/environments.md describes it, read in one piece."""
    name = environment.encode()
    tag = label.encode()
    material = (
        DRAW_DOMAIN
        + len(name).to_bytes(4, "little")
        + name
        + seed.to_bytes(8, "little")
        + prompt_id.to_bytes(8, "little")
        + len(tag).to_bytes(4, "little")
        + tag
    )
    output = blake3.blake3(material).digest(length=8 * count)
    return list(struct.unpack(f"<{count}Q", output))


def test_words_match_the_specification_across_buffer_refills() -> None:
    stream = DrawStream("arithmetic", 7, 123, "problem")
    words = [stream.word() for _ in range(100)]  # more than one internal read
    assert words == _words_from_spec("arithmetic", 7, 123, "problem", 100)
    assert DRAW_DOMAIN == b"rollnet.environment-draw.v1\x00"


def test_below_rejects_words_in_the_biased_tail() -> None:
    # For bound 3 the accepted words are those below 2**64 - (2**64 mod 3); find a stream whose
    # first word is rejected and check the second one is used instead.
    bound = 3 * 2**62  # large bound: about a quarter of all words are rejected
    limit = 2**64 - (2**64 % bound)
    for prompt_id in range(200):
        first, second = _words_from_spec("e", 0, prompt_id, "x", 2)
        if first >= limit and second < limit:
            assert DrawStream("e", 0, prompt_id, "x").below(bound) == second % bound
            break
    else:
        pytest.fail("no stream with a rejected first word in 200 tries")


def test_streams_are_independent_per_input() -> None:
    base = DrawStream("arithmetic", 0, 5, "problem").word()
    assert DrawStream("arithmetic", 0, 5, "problem").word() == base
    assert DrawStream("arithmetic", 1, 5, "problem").word() != base
    assert DrawStream("arithmetic", 0, 6, "problem").word() != base
    assert DrawStream("arithmetic", 0, 5, "target_length").word() != base
    assert DrawStream("math", 0, 5, "problem").word() != base


def test_below_is_roughly_uniform() -> None:
    counts = Counter(DrawStream("e", 0, i, "u").below(6) for i in range(6000))
    assert set(counts) == set(range(6))
    assert all(850 <= counts[value] <= 1150 for value in range(6)), counts


@pytest.mark.parametrize(
    ("seed", "prompt_id"), [(-1, 0), (2**64, 0), (0, -1), (0, MAX_PROMPT_ID + 1)]
)
def test_out_of_range_inputs_are_refused(seed: int, prompt_id: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        DrawStream("e", seed, prompt_id, "x")


def test_degenerate_bounds() -> None:
    stream = DrawStream("e", 0, 0, "x")
    assert stream.below(1) == 0
    assert stream.between(5, 5) == 5
    with pytest.raises(ValueError, match="bound"):
        stream.below(0)
    with pytest.raises(ValueError, match="empty range"):
        stream.between(2, 1)
    with pytest.raises(ValueError, match="empty"):
        stream.choice([])

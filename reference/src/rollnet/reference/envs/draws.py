"""Deterministic, portable random draws for environments.

Workers and validators must rebuild the identical prompt from (environment name, config, prompt
id), possibly in different processes, Python versions or languages. :mod:`random` and NumPy make no
promise that their algorithms stay fixed, so environments draw from a BLAKE3 extendable output
instead, specified exactly here and in ``docs/environments.md``:

* material = ``DRAW_DOMAIN`` || u32le(len(name)) || name || u64le(seed) || u64le(prompt_id) ||
  u32le(len(label)) || label, with ``name`` and ``label`` in UTF-8;
* the stream is BLAKE3's extendable output over ``material``, read as consecutive little-endian
  unsigned 64-bit words;
* ``below(n)`` reads words until one is < 2**64 − (2**64 mod n) and returns it mod n (rejection
  sampling, so every value in ``[0, n)`` is exactly equally likely).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypeVar

import blake3

from rollnet.sdk.domains import DRAW_DOMAIN

__all__ = ["DRAW_DOMAIN", "MAX_PROMPT_ID", "DrawStream"]


#: Prompt ids are unsigned 64-bit integers (``uint64 prompt_ids`` in ``rollnet.v1.Task``).
MAX_PROMPT_ID = 2**64 - 1

_WORD = 8
_WORDS_PER_READ = 32
_T = TypeVar("_T")


class DrawStream:
    """A stream of uniform integers derived from (environment, seed, prompt id, label).

    Use a distinct ``label`` per independent purpose (for example ``"problem"`` and
    ``"target_length"``) so that enabling one feature never shifts the draws of another.
    """

    def __init__(self, environment: str, seed: int, prompt_id: int, label: str) -> None:
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} is outside [0, 2**64)")
        if not 0 <= prompt_id <= MAX_PROMPT_ID:
            raise ValueError(f"prompt id {prompt_id} is outside [0, 2**64)")
        name_bytes = environment.encode("utf-8")
        label_bytes = label.encode("utf-8")
        material = b"".join(
            (
                DRAW_DOMAIN,
                struct.pack("<I", len(name_bytes)),
                name_bytes,
                struct.pack("<QQ", seed, prompt_id),
                struct.pack("<I", len(label_bytes)),
                label_bytes,
            )
        )
        self._hasher = blake3.blake3(material)
        self._offset = 0  # next unread byte of the extendable output
        self._buffer: tuple[int, ...] = ()
        self._position = 0

    def word(self) -> int:
        """Return the next unsigned 64-bit word of the stream."""
        if self._position == len(self._buffer):
            chunk = self._hasher.digest(length=_WORD * _WORDS_PER_READ, seek=self._offset)
            self._offset += len(chunk)
            self._buffer = struct.unpack(f"<{_WORDS_PER_READ}Q", chunk)
            self._position = 0
        value = self._buffer[self._position]
        self._position += 1
        return value

    def below(self, bound: int) -> int:
        """Return a uniform integer in ``[0, bound)``, for ``1 <= bound <= 2**64``."""
        if not 1 <= bound <= 2**64:
            raise ValueError(f"bound {bound} is outside [1, 2**64]")
        limit = 2**64 - (2**64 % bound)
        while True:
            value = self.word()
            if value < limit:
                return value % bound

    def between(self, low: int, high: int) -> int:
        """Return a uniform integer in ``[low, high]``: ``low + below(high - low + 1)``."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        return low + self.below(high - low + 1)

    def choice(self, options: Sequence[_T]) -> _T:
        """Return ``options[below(len(options))]``."""
        if not options:
            raise ValueError("cannot choose from an empty sequence")
        return options[self.below(len(options))]

"""Torch twin of :mod:`rollnet.sdk.proofs.sampling`: the same integer hash on any torch device.

Imports torch, so it is not imported by ``rollnet.sdk.proofs``; install the ``torch`` extra.
All integer work is int64 with values below 2**34, so it cannot overflow on CPU or GPU.
"""

from __future__ import annotations

import torch

from rollnet.sdk.proofs.sampling import MASK32, MIX_MUL_1, MIX_MUL_2, SEED_KEY, UNIFORM_BITS


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    c_lo, c_hi = constant & 0xFFFF, constant >> 16
    x_lo, x_hi = x & 0xFFFF, x >> 16
    cross = ((x_hi * c_lo + x_lo * c_hi) & 0xFFFF) << 16
    return (x_lo * c_lo + cross) & MASK32


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_MUL_1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_MUL_2)
    return x ^ (x >> 16)


def noise_bits(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """32-bit hashes ``[N, V]`` (int64) for int64 ``seeds`` [N] and ``positions`` [N]."""
    seeds = seeds.to(torch.int64).reshape(-1)
    positions = positions.to(device=seeds.device, dtype=torch.int64).reshape(-1)
    h = _mix((seeds & MASK32) ^ SEED_KEY)
    h = _mix(h ^ (seeds >> 32))
    h = _mix(h ^ positions)
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    return _mix(h[:, None] ^ tokens[None, :])


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise ``[N, V]`` in float64, bit-compatible with the numpy version's hash."""
    bits = noise_bits(seeds, positions, vocab_size)
    u = ((bits >> (32 - UNIFORM_BITS)).to(torch.float64) + 0.5) * (2.0**-UNIFORM_BITS)
    return -torch.log(-torch.log(u))

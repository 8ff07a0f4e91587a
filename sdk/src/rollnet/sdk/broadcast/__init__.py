"""Checkpoint broadcast: shards from a tree of untrusted relays, lossless deltas between steps.

* :class:`RelayShards` — a :class:`~rollnet.sdk.checkpoints.ShardSource` that fetches from
  relays sampled by success rate x bandwidth, verifies each shard, reports bad relays and
  resumes with ``Range``;
* :mod:`rollnet.sdk.broadcast.delta` — the ``rollnet-delta-v1`` format
  (:func:`encode_delta`, :func:`apply_delta`);
* :class:`TerminalProgress` — a progress line for ``CheckpointStore(progress=...)``.

docs/broadcast.md is the operator's guide (relays, nginx in front of an origin, threat model).
"""

from rollnet.sdk.broadcast.client import (
    BLOB_PATH,
    BadShardReport,
    RelayError,
    RelayHealth,
    RelayShards,
    relay_list,
    sample_weights,
)
from rollnet.sdk.broadcast.delta import DeltaError, DeltaStats, apply_delta, encode_delta
from rollnet.sdk.broadcast.progress import TerminalProgress

__all__ = [
    "BLOB_PATH",
    "BadShardReport",
    "DeltaError",
    "DeltaStats",
    "RelayError",
    "RelayHealth",
    "RelayShards",
    "TerminalProgress",
    "apply_delta",
    "encode_delta",
    "relay_list",
    "sample_weights",
]

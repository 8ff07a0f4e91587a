"""The checkpoint relay: an HTTP pull-through cache of content-addressed blobs.

``rollnet relay --origin DIR`` serves the blobs a trainer wrote (``publish --origin-dir``);
``rollnet relay --upstream URL[,URL...]`` caches and forwards them, streaming each blob down
while it still arrives, so relays chain into trees of any depth. Clients
(:class:`rollnet.sdk.broadcast.RelayShards`) verify everything: a relay is untrusted.
docs/broadcast.md is the operator's guide.
"""

from rollnet.reference.relay.cache import BlobCache, BlobUnavailable, Fetch
from rollnet.reference.relay.metrics import RelayMetrics
from rollnet.reference.relay.prefetch import prefetch_checkpoints, watch_coordinator
from rollnet.reference.relay.server import RateLimiter, RelayConfig, RelayServer, start_relay

__all__ = [
    "BlobCache",
    "BlobUnavailable",
    "Fetch",
    "RateLimiter",
    "RelayConfig",
    "RelayMetrics",
    "RelayServer",
    "prefetch_checkpoints",
    "start_relay",
    "watch_coordinator",
]

"""The verifier's replay cache: the nonces each key used within the replay window, in memory.

Partitioned by key, so that what one key does cannot make the cache forget, or refuse, another's:

- A **registered** key (one the server's key resolver knows) may hold ``per_key_capacity`` live
  nonces. Its first ``reserved_per_key`` are its own; beyond them it draws on a pool shared by
  all registered keys (``capacity``). At most ``max_keys`` registered keys hold live nonces at
  once.
- A **trusted** key (a registered key the server trusts: an allow-listed trainer, validator or
  operator) is bounded by ``per_key_capacity`` alone: it neither draws on the shared pool nor
  counts against ``max_keys``, so registered keys filling those cannot slow it down. The
  server's allow-list bounds how many there are.
- An **unregistered** key (a fresh key: all it may call is RegisterNode) has a pool of its own:
  at most ``max_unregistered_keys`` such keys at once, ``unregistered_per_key`` nonces each,
  and at most ``unregistered_per_address`` of them from one network address. A flood of fresh
  keys fills its address's share (from many addresses, the pool) and then has its new keys
  refused; it never touches what registered keys hold or may still use.

Nothing live is ever evicted: a nonce stays until its window closes (``ttl`` after it was
recorded), and a key's partition goes with its last nonce. When a bound is reached the new call
is refused (:class:`NonceCacheFull`, naming the bound) rather than an older nonce forgotten,
which would let that call be replayed. Memory is therefore bounded by
``max_keys * reserved_per_key + capacity + max_unregistered_keys * unregistered_per_key``
nonces (plus ``per_key_capacity`` per trusted key), ``max_keys + max_unregistered_keys``
partitions (plus the trusted keys) and as many addresses, whatever callers do, and each call
costs O(1) (amortized: one expiry per recorded nonce).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable


class NonceCacheFull(Exception):
    """A bound of the nonce cache refuses this call; it must come back later.

    ``limit`` names the bound: ``per_key`` (this key's share), ``shared`` (the pool registered
    keys draw on beyond their reserve), ``keys`` (registered keys at once),
    ``unregistered_keys`` (fresh keys registering at once) or ``address`` (fresh keys
    registering at once from the caller's address).
    """

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.message = message
        #: Seconds until the nonce that frees this bound expires (this key's oldest for
        #: ``per_key``, the cache's oldest otherwise: a lower bound); ``None`` when unknown.
        self.retry_after: float | None = None


class _Partition:
    """One key's live nonces."""

    __slots__ = ("address", "nonces", "registered", "trusted")

    def __init__(self, registered: bool, trusted: bool, address: str | None) -> None:
        #: Live nonces and when each expires, oldest first (insertion order is expiry order).
        self.nonces: dict[str, float] = {}
        self.registered = registered
        #: Bounded by the per-key capacity alone (no shared pool, no key bound).
        self.trusted = trusted
        #: Where an unregistered key's first call came from (its address's share holds it).
        self.address = address


class NonceCache:
    """Nonces seen per key within the replay window; bounded, entries expire after ``ttl``.

    Expiry is measured on a monotonic clock from the moment a nonce is recorded. A verifier uses
    ``ttl = 2 * skew`` (and a margin) because an accepted timestamp can lie up to ``skew`` in
    the future, so the request stays acceptable for up to ``2 * skew`` after it arrives, that
    instant included. See the module docs
    for the bounds; ``None`` for ``per_key_capacity`` means ``capacity``, for ``max_keys`` and
    the unregistered bounds it means no bound beyond the others.
    """

    def __init__(
        self,
        *,
        ttl: float,
        capacity: int,
        per_key_capacity: int | None = None,
        reserved_per_key: int = 0,
        max_keys: int | None = None,
        max_unregistered_keys: int | None = None,
        unregistered_per_key: int | None = None,
        unregistered_per_address: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        per_key = capacity if per_key_capacity is None else per_key_capacity
        if (
            ttl <= 0
            or capacity < 1
            or per_key < 1
            or not 0 <= reserved_per_key <= per_key
            or (max_keys is not None and max_keys < 1)
            or (max_unregistered_keys is not None and max_unregistered_keys < 1)
            or (unregistered_per_key is not None and unregistered_per_key < 1)
            or (unregistered_per_address is not None and unregistered_per_address < 1)
        ):
            raise ValueError(
                "NonceCache needs ttl > 0, capacities and key bounds >= 1 and "
                "0 <= reserved_per_key <= per_key_capacity"
            )
        self._ttl = ttl
        self._capacity = capacity
        self._per_key = per_key
        self._reserved = reserved_per_key
        self._max_keys = max_keys
        self._max_unregistered = max_unregistered_keys
        self._unregistered_per_key = (
            per_key if unregistered_per_key is None else unregistered_per_key
        )
        self._per_address = unregistered_per_address
        self._clock = clock
        self._partitions: dict[bytes, _Partition] = {}
        #: Unregistered keys holding live nonces, by the address of their first call.
        self._by_address: collections.Counter[str] = collections.Counter()
        self._registered_keys = 0
        self._trusted_keys = 0
        self._unregistered_keys = 0
        self._live = 0
        #: Registered keys' live nonces beyond their reserve: sum of max(0, len - reserved).
        self._shared_in_use = 0
        # Insertion order equals expiry order (constant ttl, monotonic clock).
        self._order: collections.deque[tuple[float, bytes, str]] = collections.deque()

    def __len__(self) -> int:
        """Live nonces, all keys together."""
        self._purge(self._clock())
        return self._live

    @property
    def registered_keys(self) -> int:
        """Registered keys holding live nonces."""
        self._purge(self._clock())
        return self._registered_keys

    @property
    def trusted_keys(self) -> int:
        """Trusted keys holding live nonces (not counted in :attr:`registered_keys`)."""
        self._purge(self._clock())
        return self._trusted_keys

    @property
    def unregistered_keys(self) -> int:
        """Unregistered keys holding live nonces."""
        self._purge(self._clock())
        return self._unregistered_keys

    @property
    def shared_in_use(self) -> int:
        """Live nonces drawn on the shared pool (registered keys' beyond their reserve)."""
        self._purge(self._clock())
        return self._shared_in_use

    def record(
        self,
        public_key: bytes,
        nonce: str,
        *,
        registered: bool = True,
        trusted: bool = False,
        address: str | None = None,
    ) -> bool:
        """Record ``nonce`` for ``public_key``; ``False`` when it is already recorded and live.

        ``registered``: whether the server knows the key. ``address``: the caller's network
        address (an unregistered key counts against its share; ``None``: no such share). A key
        once recorded as registered keeps its partition's bounds until that partition expires;
        an unregistered key's partition moves to the registered bounds on its first call as a
        registered key. ``trusted`` (with ``registered``): the key is bounded by the per-key
        capacity alone; a registered partition follows it from call to call (a key allow-listed
        or revoked while it calls on moves between the trusted and the registered bounds).
        Raises :class:`NonceCacheFull` when a bound would be exceeded; nothing is recorded then.
        """
        now = self._clock()
        self._purge(now)
        partition = self._partitions.get(public_key)
        if partition is not None and nonce in partition.nonces:
            return False
        if (
            partition is not None
            and registered
            and partition.registered
            and partition.trusted != trusted
        ):
            self._retrust(partition, trusted)
        held = 0 if partition is None else len(partition.nonces)
        promote = registered and partition is not None and not partition.registered
        as_registered = registered or (partition is not None and partition.registered)
        new_key = partition is None or promote
        # Trust is the partition's, taken when it is created or moved to the registered bounds.
        as_trusted = as_registered and (
            trusted if new_key or partition is None else partition.trusted
        )
        beyond = max(0, held - self._reserved)  # what this key holds beyond its reserve
        try:
            if as_trusted:
                if held >= self._per_key:
                    raise NonceCacheFull(
                        "per_key",
                        f"this key made {held:,} calls within the replay window ({self._ttl:g} s), "
                        "its most",
                    )
            elif as_registered:
                max_keys = self._max_keys
                if new_key and max_keys is not None and self._registered_keys >= max_keys:
                    raise NonceCacheFull(
                        "keys",
                        f"{self._max_keys:,} keys are calling within the replay window "
                        f"({self._ttl:g} s), the most this server remembers at once",
                    )
                if held >= self._per_key:
                    raise NonceCacheFull(
                        "per_key",
                        f"this key made {held:,} calls within the replay window ({self._ttl:g} s), "
                        "its most",
                    )
                # A promoted partition brings what it holds beyond its reserve onto the pool.
                shared = self._shared_in_use + (beyond if promote else 0)
                if held >= self._reserved and shared >= self._capacity:
                    raise NonceCacheFull(
                        "shared",
                        f"calls within the replay window ({self._ttl:g} s) fill this server's "
                        f"shared replay cache; this key's reserved {self._reserved:,} are in use",
                    )
            else:
                limit = self._max_unregistered
                if partition is None and limit is not None and self._unregistered_keys >= limit:
                    raise NonceCacheFull(
                        "unregistered_keys",
                        f"{limit:,} unregistered keys are registering within the replay window "
                        f"({self._ttl:g} s), the most this server remembers at once",
                    )
                share = self._per_address
                if (
                    partition is None
                    and share is not None
                    and address is not None
                    and self._by_address[address] >= share
                ):
                    raise NonceCacheFull(
                        "address",
                        f"{share:,} unregistered keys from {address} are registering within the "
                        f"replay window ({self._ttl:g} s), the most from one address",
                    )
                if held >= self._unregistered_per_key:
                    raise NonceCacheFull(
                        "per_key",
                        f"this unregistered key made {held:,} calls within the replay window "
                        f"({self._ttl:g} s), its most",
                    )
        except NonceCacheFull as full:
            # A hint, not a promise: this key's oldest nonce for its own bound, else the oldest.
            full.retry_after = self._wait(now, partition if full.limit == "per_key" else None)
            raise
        if partition is None:
            partition = _Partition(as_registered, as_trusted, None if as_registered else address)
            self._partitions[public_key] = partition
            if as_trusted:
                self._trusted_keys += 1
            elif as_registered:
                self._registered_keys += 1
            else:
                self._unregistered_keys += 1
                if address is not None:
                    self._by_address[address] += 1
        elif promote:
            partition.registered = True
            partition.trusted = as_trusted
            self._leave_address(partition)
            self._unregistered_keys -= 1
            if as_trusted:
                self._trusted_keys += 1
            else:
                self._registered_keys += 1
                self._shared_in_use += beyond
        if as_registered and not as_trusted and held >= self._reserved:
            self._shared_in_use += 1
        expires = now + self._ttl  # one float object, shared by both entries
        partition.nonces[nonce] = expires
        self._live += 1
        self._order.append((expires, public_key, nonce))
        return True

    def _purge(self, now: float) -> None:
        order, partitions = self._order, self._partitions
        while order and order[0][0] <= now:
            _, key, nonce = order.popleft()
            partition = partitions[key]
            draws = partition.registered and not partition.trusted
            if draws and len(partition.nonces) > self._reserved:
                self._shared_in_use -= 1
            del partition.nonces[nonce]
            self._live -= 1
            if not partition.nonces:
                del partitions[key]
                if partition.trusted:
                    self._trusted_keys -= 1
                elif partition.registered:
                    self._registered_keys -= 1
                else:
                    self._unregistered_keys -= 1
                    self._leave_address(partition)

    def _wait(self, now: float, partition: _Partition | None) -> float:
        """Seconds until ``partition``'s oldest nonce expires (``None``: the cache's oldest)."""
        if partition is not None and partition.nonces:
            expires = next(iter(partition.nonces.values()))
        else:
            expires = self._order[0][0] if self._order else now
        return max(0.0, expires - now)

    def _retrust(self, partition: _Partition, trusted: bool) -> None:
        """Move a registered key's partition to the bounds of its trust now (a key allow-listed,
        or its role revoked, while it calls on, so its partition never expires)."""
        beyond = max(0, len(partition.nonces) - self._reserved)
        partition.trusted = trusted
        if trusted:
            self._registered_keys -= 1
            self._trusted_keys += 1
            self._shared_in_use -= beyond
        else:
            # What it holds was bounded by the per-key capacity: it may overfill the key bound
            # or the shared pool for one window, which refuse calls beyond reserves meanwhile.
            self._trusted_keys -= 1
            self._registered_keys += 1
            self._shared_in_use += beyond

    def _leave_address(self, partition: _Partition) -> None:
        address, partition.address = partition.address, None
        if address is not None:
            self._by_address[address] -= 1
            if not self._by_address[address]:
                del self._by_address[address]

"""The reference coordinator the conformance tests run the suite against, and what the suite is
told about it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import Identity
from rollnet.sdk.conformance import TargetConfig

NETWORK = "rollnet-conformance"
QUOTA = 256 * 1024
MESSAGE_CAP = 1 << 20


@dataclass
class Running:
    """The coordinator under test and what the suite is told about it."""

    coordinator: Coordinator
    config: CoordinatorConfig
    keys: dict[str, Identity]
    replica: str | None = None
    """Another replica's address (on PostgreSQL), for the cross-replica cases."""

    @property
    def address(self) -> str:
        return self.coordinator.address

    async def restart(self) -> None:
        await self.coordinator.stop(grace=0.5)
        self.coordinator = await start_coordinator(
            replace(self.config, listen=self.coordinator.address)
        )

    def target(self, **changes: object) -> TargetConfig:
        config = TargetConfig(
            target=self.address,
            network_id=NETWORK,
            keys=self.keys,
            restart=self.restart,
            replica=self.replica,
            invite_pool="invited",
            invite_token="conformance-token",
            upload_quota_bytes=QUOTA,
            max_message_bytes=MESSAGE_CAP,
            max_wait=15.0,
        )
        return replace(config, **changes)  # type: ignore[arg-type]

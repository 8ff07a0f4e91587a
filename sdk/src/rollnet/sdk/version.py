"""The versions rollnet reports: the protocol's, and the release series in software versions.

The protocol version is what a node registers with (``ProtocolVersion{major, minor}``; the
reference coordinator admits any ``1.x``); the release series names the Python packages'
``0.x`` line in every default ``software_version`` and user agent (``rollnet-sdk/0.1``).
See ``CHANGELOG.md`` for what each number promises.
"""

from __future__ import annotations

from typing import Final

PROTOCOL_MAJOR: Final = 1
"""Major protocol version: implementations of another major cannot talk to this one."""
PROTOCOL_MINOR: Final = 0
"""Minor protocol version: raised by wire-compatible additions."""
RELEASE_SERIES: Final = "0.1"
"""The packages' release series, in software versions and user agents."""


def software_version(component: str) -> str:
    """The software version a rollnet component reports: ``rollnet-<component>/<series>``."""
    return f"rollnet-{component}/{RELEASE_SERIES}"


__all__ = ["PROTOCOL_MAJOR", "PROTOCOL_MINOR", "RELEASE_SERIES", "software_version"]

"""The JSON Lines export format of the ledger (``rollnet ledger export``).

One JSON object per line, each with a ``"type"``:

- ``"header"`` (first line): ``format`` = ``"rollnet.ledger.export"``, ``version`` = 1,
  ``exported_at`` (RFC 3339), ``tip_sequence`` and ``tip_hash`` (the chain tip when exported).
- ``"signed_head"``: ``network_id``, ``sequence``, ``head_hash``, ``signer_public_key``,
  ``signature``, ``signed_at``.
- ``"entry"``: ``sequence``, ``time_us``, ``node_id``, ``kind``, ``amount``, ``commitment_id``,
  ``verdict_id`` (``null`` when absent), ``memo``, ``prev_hash``, ``entry_hash``; entries appear
  in sequence order.

Binary values are lowercase hex. Standard library only, so verifiers need nothing else.
"""

from __future__ import annotations

import json
from typing import Any

EXPORT_FORMAT = "rollnet.ledger.export"
EXPORT_VERSION = 1

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def header_line(*, exported_at: str, tip_sequence: int, tip_hash: bytes) -> str:
    """The header line (without newline)."""
    return _dumps(
        {
            "type": "header",
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "exported_at": exported_at,
            "tip_sequence": tip_sequence,
            "tip_hash": tip_hash.hex(),
        }
    )


def entry_line(
    *,
    sequence: int,
    time_us: int,
    node_id: str,
    kind: str,
    amount: int,
    commitment_id: str | None,
    verdict_id: str | None,
    memo: str,
    prev_hash: bytes,
    entry_hash: bytes,
) -> str:
    """One entry line (without newline)."""
    record: dict[str, Any] = {
        "type": "entry",
        "sequence": sequence,
        "time_us": time_us,
        "node_id": node_id,
        "kind": kind,
        "amount": amount,
        "commitment_id": commitment_id,
        "verdict_id": verdict_id,
        "memo": memo,
        "prev_hash": prev_hash.hex(),
        "entry_hash": entry_hash.hex(),
    }
    return _dumps(record)


def signed_head_line(
    *,
    network_id: str,
    sequence: int,
    head_hash: bytes,
    signer_public_key: bytes,
    signature: bytes,
    signed_at: str,
) -> str:
    """One signed-head line (without newline)."""
    return _dumps(
        {
            "type": "signed_head",
            "network_id": network_id,
            "sequence": sequence,
            "head_hash": head_hash.hex(),
            "signer_public_key": signer_public_key.hex(),
            "signature": signature.hex(),
            "signed_at": signed_at,
        }
    )

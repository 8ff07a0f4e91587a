"""Adversarial workers: real worker processes that run one cheat each (tests and the demo).

``python -m rollnet.reference.adversary --cheat token_altered --coordinator HOST:PORT --key FILE
--data-dir DIR`` runs one. See :mod:`rollnet.reference.adversary.cheats` for the cheats and
the check that catches each.
"""

from rollnet.reference.adversary.cheats import (
    CHEATS,
    NODE_STATISTICS,
    Cheat,
    CheatingBackend,
    CheatingGenerator,
    CheatingWorker,
    CheatSpec,
    build_cheating_worker,
)

__all__ = [
    "CHEATS",
    "NODE_STATISTICS",
    "Cheat",
    "CheatSpec",
    "CheatingBackend",
    "CheatingGenerator",
    "CheatingWorker",
    "build_cheating_worker",
]

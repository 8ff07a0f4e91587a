"""The chaos harness: the local swarm under injected faults, and the invariants checked after.

``bench/chaos.py`` runs it with a budget and prints the table; ``tests/test_chaos.py`` runs a
short version and asserts the invariants. docs/reliability.md has what is injected and why.
"""

from rollnet.reference.chaos.run import (
    FAULT_KINDS,
    ChaosConfig,
    ChaosReport,
    FaultRecord,
    run_chaos,
)
from rollnet.reference.chaos.swarm import SwarmConfig

__all__ = ["FAULT_KINDS", "ChaosConfig", "ChaosReport", "FaultRecord", "SwarmConfig", "run_chaos"]

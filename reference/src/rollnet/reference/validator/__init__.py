"""The reference validator: trusted nodes that turn commitments into verdicts.

:func:`validate_job` runs every check on one job (integrity, batch, binding, assigned data,
TOPLOC, sampling, termination, reward) with one batched prefill; :class:`Validator` is the
process around it (``rollnet validator``). See ``docs/validator.md``.
"""

from rollnet.reference.validator.checkpoint_cache import CheckpointModels
from rollnet.reference.validator.metrics import ValidatorMetrics
from rollnet.reference.validator.node import Validator, ValidatorConfig, ValidatorFatalError
from rollnet.reference.validator.pipeline import (
    ChallengeInvalid,
    CheckpointModel,
    EnvironmentCache,
    JobOutcome,
    JobUncheckable,
    ValidatorCheck,
    ValidatorReason,
    validate_job,
)

__all__ = [
    "ChallengeInvalid",
    "CheckpointModel",
    "CheckpointModels",
    "EnvironmentCache",
    "JobOutcome",
    "JobUncheckable",
    "Validator",
    "ValidatorCheck",
    "ValidatorConfig",
    "ValidatorFatalError",
    "ValidatorMetrics",
    "ValidatorReason",
    "validate_job",
]

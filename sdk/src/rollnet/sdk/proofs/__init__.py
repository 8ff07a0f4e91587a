"""Verifiable rollouts: TOPLOC commitments, seeded Gumbel-max sampling and the rollout checks.

Importing this package needs numpy (and blake3) only. The torch twin of the noise generator is
:mod:`rollnet.sdk.proofs.sampling_torch` (``rollnet-sdk[torch]``), imported on demand.
"""

from rollnet.sdk.proofs._field import use_compiled_kernel
from rollnet.sdk.proofs.assigned import check_assigned_data
from rollnet.sdk.proofs.binding import (
    LeaseBinding,
    check_binding,
    commitment_digest,
    derive_sampling_seed,
    proof_digest,
    tokens_digest,
)
from rollnet.sdk.proofs.challenge import (
    challenge_message,
    challenged_rollouts,
    detection_probability,
    sign_challenge,
    verify_challenge,
)
from rollnet.sdk.proofs.report import (
    CheckName,
    CheckResult,
    Reason,
    Verdict,
    VerificationReport,
)
from rollnet.sdk.proofs.sampling import (
    check_sampling,
    check_sampling_batch,
    gumbel_noise,
    gumbel_scores,
    noise_bits,
    sampling_margins,
    token_logprobs,
)
from rollnet.sdk.proofs.termination import (
    FINISH_EOS,
    FINISH_LENGTH,
    check_termination,
    checkpoint_eos_token_ids,
    eos_probabilities,
    eos_token_ids,
    finish_reason,
)
from rollnet.sdk.proofs.thresholds import (
    BFLOAT16,
    FLOAT32,
    TOPLOC_PAPER,
    Thresholds,
    thresholds_for,
)
from rollnet.sdk.proofs.toploc import (
    PROOF_BYTES,
    TOPK,
    WINDOW,
    ProofFormatError,
    WindowStats,
    build_proof,
    check_toploc,
    check_toploc_batch,
    encode_windows,
    parse_proof,
    proof_size,
    verify_proof,
    verify_proofs,
)
from rollnet.sdk.proofs.verify import (
    RolloutAssignment,
    RolloutClaim,
    verify_rollout,
    verify_rollouts,
)

__all__ = [
    "BFLOAT16",
    "FINISH_EOS",
    "FINISH_LENGTH",
    "FLOAT32",
    "PROOF_BYTES",
    "TOPK",
    "TOPLOC_PAPER",
    "WINDOW",
    "CheckName",
    "CheckResult",
    "LeaseBinding",
    "ProofFormatError",
    "Reason",
    "RolloutAssignment",
    "RolloutClaim",
    "Thresholds",
    "Verdict",
    "VerificationReport",
    "WindowStats",
    "build_proof",
    "challenge_message",
    "challenged_rollouts",
    "check_assigned_data",
    "check_binding",
    "check_sampling",
    "check_sampling_batch",
    "check_termination",
    "check_toploc",
    "check_toploc_batch",
    "checkpoint_eos_token_ids",
    "commitment_digest",
    "derive_sampling_seed",
    "detection_probability",
    "encode_windows",
    "eos_probabilities",
    "eos_token_ids",
    "finish_reason",
    "gumbel_noise",
    "gumbel_scores",
    "noise_bits",
    "parse_proof",
    "proof_digest",
    "proof_size",
    "sampling_margins",
    "sign_challenge",
    "thresholds_for",
    "token_logprobs",
    "tokens_digest",
    "use_compiled_kernel",
    "verify_challenge",
    "verify_proof",
    "verify_proofs",
    "verify_rollout",
    "verify_rollouts",
]

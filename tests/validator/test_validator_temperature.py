"""Issue 19, item 1: honest bf16 work is accepted at low temperature, through ``validate_job``.

The tolerances follow the error model (``rollnet.sdk.proofs.thresholds``): fixed in logit units,
so in score units they grow as 1/T. The model is the tiny one with its final-norm weight scaled
up 4x (larger logits, so the magnitude term of the model is exercised). An altered token is
still rejected at low temperature: the tolerance grows as 1/T, but so does every score gap.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from safetensors.torch import load_file, save_file
from validator_testing import seal_job

from rollnet.reference.adversary import Cheat, CheatingGenerator
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.reference.validator import CheckpointModel, EnvironmentCache, validate_job
from rollnet.reference.worker import InferenceGenerator
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.proofs import BFLOAT16
from rollnet.sdk.testing import NETWORK_ID
from rollnet.sdk.worker import LeaseContext
from rollnet.v1 import common_pb2, rollout_pb2, task_pb2, validation_pb2

LOGIT_SCALE = 4.0
MAX_NEW_TOKENS = 24
PROMPTS = (3, 17, 29, 41)
SAMPLES = 4


@dataclass
class Bench:
    root: Path
    model: CheckpointModel
    environments: EnvironmentCache
    counter: Iterator[int]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    root = tmp_path_factory.mktemp("temperature")
    model_dir = init_tiny_model(root / "checkpoints" / "step-1", seed=0)
    # Larger logits: the final norm's weight scales the LM head's input, so every logit.
    weights = load_file(str(model_dir / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * LOGIT_SCALE
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    backend = TorchBackend()
    backend.load(str(model_dir), dtype="bfloat16")
    tokenizer = CheckpointTokenizer.load(model_dir)
    model = CheckpointModel(step=1, backend=backend, tokenizer=tokenizer, thresholds=BFLOAT16)
    environments = EnvironmentCache()
    yield Bench(root, model, environments, iter(range(10**6)))
    environments.close()


async def generate(
    bench: Bench, temperature: float, cheat: Cheat | None = None
) -> tuple[task_pb2.Task, validation_pb2.ValidationJob, bytes]:
    """A bf16 job at ``temperature`` from the reference generator (or a cheating one)."""
    number = next(bench.counter)
    task = task_pb2.Task(
        task_id=f"task-{number}",
        environment="arithmetic",
        prompt_ids=[p + number for p in PROMPTS],
        samples_per_prompt=SAMPLES,
        sampling=common_pb2.SamplingParams(temperature=temperature, max_new_tokens=MAX_NEW_TOKENS),
        checkpoint_step=1,
        compute_dtype=common_pb2.COMPUTE_DTYPE_BFLOAT16,
    )
    lease = task_pb2.Lease(lease_id=f"lease-{number}", fencing_token=1)
    store = CheckpointStore(bench.root / "checkpoints", network_id=NETWORK_ID)
    generator: InferenceGenerator
    if cheat is None:
        generator = InferenceGenerator(TorchBackend, store, dtype="bfloat16")
    else:
        generator = CheatingGenerator(cheat, store)
        generator.dtype = "bfloat16"
    context = LeaseContext(
        task=task,
        lease=lease,
        network_id=NETWORK_ID,
        node_id=f"node-{number}",
        client=cast(RollnetClient, None),
        deadline=time.monotonic() + 600,
    )
    try:
        rollouts: list[rollout_pb2.Rollout] = list(await generator.generate(task, context))
    finally:
        generator.close()
    job, blob = seal_job(task, context.binding, rollouts)
    return task, job, blob


def figures(outcome: object, check: str, name: str) -> list[float]:
    checks = [c for c in outcome.checks if c.check == check]  # type: ignore[attr-defined]
    return [float(c.figures[name]) for c in checks if name in c.figures]


@pytest.mark.parametrize("temperature", [0.13, 0.001])
async def test_honest_bf16_work_at_low_temperature_is_accepted(
    bench: Bench, temperature: float
) -> None:
    _task, job, blob = await generate(bench, temperature)
    outcome = validate_job(job, blob, bench.model, bench.environments)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    fractions = figures(outcome, "sampling", "min_margin_fraction")
    assert len(fractions) == len(PROMPTS) * SAMPLES
    assert min(fractions) >= -1.0
    logprob_fractions = figures(outcome, "behaviour_logprobs", "max_tolerance_fraction")
    assert len(logprob_fractions) == len(PROMPTS) * SAMPLES
    assert max(logprob_fractions) <= 1.0


@pytest.mark.parametrize("temperature", [0.13, 0.001])
async def test_an_altered_token_is_rejected_at_low_temperature(
    bench: Bench, temperature: float
) -> None:
    _task, job, blob = await generate(bench, temperature, Cheat.TOKEN_ALTERED)
    outcome = validate_job(job, blob, bench.model, bench.environments)
    assert not outcome.accepted
    failed = [c for c in outcome.checks if not c.passed]
    sampling = [c for c in failed if c.check == "sampling"]
    # Every rollout has one token edited; each is rejected by the sampling check.
    assert len(sampling) == len(PROMPTS) * SAMPLES, [(c.check, c.reason) for c in failed]
    assert {c.reason for c in sampling} == {"TOKEN_NOT_SAMPLED"}
    worst = np.asarray([float(c.figures["min_margin_fraction"]) for c in sampling])
    assert (worst < -1.0).all()

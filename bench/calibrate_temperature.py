"""Calibrate the error model of the numeric checks over dtype x temperature: honest work only.

For each network dtype (float32, bfloat16), each temperature of the range the coordinator admits
and models with small and large logits (the tiny model, and copies whose final-norm weight is
scaled up so the LM head's logits are 8x and 48x larger), generates honest rollouts under every
honest variation reachable on a CPU (batched vs. single-sequence generation, 1 vs. 2 intra-op
threads, KV-cache decode vs. full recompute, SDPA vs. eager attention, batched vs. single-rollout
validator prefill) and checks them with the calibrated thresholds, as the validator does
(``verify_rollouts`` and the behaviour-log-probability interval). It prints:

* the error model measured directly: the worker's decode logits against the validator's prefill
  logits, the largest ``|Δ(z_i - z_j)|`` per row, as a fraction of the row's logit tolerance;
* per dtype x temperature: rollouts, tokens, false rejects (by reason), the worst sampling margin
  (score units) and as a fraction of its token's tolerance (a token is rejected below -1), the
  worst behaviour-log-probability distance as a fraction of its interval's half-width (rejected
  above 1), and the final-EOS figures.

    .venv/bin/python bench/calibrate_temperature.py [--scale 1.0] [--max-new-tokens 24]

``--scale 1.0`` runs 10,080 rollouts per dtype.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rollnet.reference.inference import harness
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.sdk.proofs import thresholds as calibrated
from rollnet.sdk.proofs.binding import derive_sampling_seed
from rollnet.sdk.proofs.report import CheckName
from rollnet.sdk.proofs.sampling import sampling_margins, token_logprob_bounds
from rollnet.sdk.proofs.statistics import NEAR_TIE_FLOOR
from rollnet.sdk.proofs.thresholds import logit_tolerances, sampling_tolerances

FIXED_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.05}
"""The tolerance before the error model: score units for the margins, nats for log-probs."""
TEMPERATURES = (0.001, 0.01, 0.05, 0.1, 0.13, 0.2, 0.5, 1.0, 1.5, 2.0)
LOGIT_SCALES = (1.0, 8.0, 48.0)
DTYPES = ("float32", "bfloat16")


class RecordingBackend(TorchBackend):
    """A torch worker that keeps the logits of every decode step (for the error model)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[np.ndarray] = []

    def _forward(self, ids: Any, mask: Any, positions: Any, cache: Any) -> Any:
        logits, hidden = super()._forward(ids, mask, positions, cache)
        self.steps.append(logits.detach().cpu().numpy().copy())
        return logits, hidden


@dataclass
class Cell:
    """Figures of one dtype x temperature."""

    rollouts: int = 0
    tokens: int = 0
    rejects: dict[str, int] = field(default_factory=dict)
    worst_margin: float = math.inf
    worst_fraction: float = math.inf
    worst_logprob_fraction: float = 0.0
    eos_endings: int = 0
    eos_won_clearly: int = 0
    fixed_rule_rejects: int = 0
    """Rollouts the fixed tolerances of before (1e-3 fp32, 0.05 bf16) would have rejected."""
    band_events: int = 0
    """Tokens with ``b < |margin / tolerance| <= 1`` (``b`` the per-node statistics' floor)."""
    band_losses: int = 0
    """Of those, tokens with ``-1 <= margin / tolerance < -b``: what the honest loss share
    ``pi0`` of the per-node statistics must bound."""


@dataclass
class ErrorRow:
    """Direct error-model figures of one dtype x logit scale."""

    rows: int = 0
    max_magnitude: float = 0.0
    worst_spread: float = 0.0
    worst_relative: float = 0.0
    worst_fraction: float = 0.0


def scaled_model(source: Path, target: Path, scale: float) -> None:
    """Copy a checkpoint with its final-norm weight multiplied by ``scale``: the hidden state
    fed to the (tied) LM head, and so every logit, grows by that factor."""
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name != "model.safetensors":
            (target / item.name).write_bytes(item.read_bytes())
    tensors = load_file(str(source / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * scale
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply rollout counts")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--temperatures", nargs="+", type=float, default=list(TEMPERATURES))
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)

    def count(n: int) -> int:
        return max(1, int(n * args.scale))

    work = Path(tempfile.mkdtemp(prefix="rollnet-calibrate-temperature-"))
    init_tiny_model(work / "tiny-x1", seed=0)
    for scale in LOGIT_SCALES[1:]:
        scaled_model(work / "tiny-x1", work / f"tiny-x{scale:g}", scale)
    prompts = harness.random_prompts(4096, seed=23)
    cursor = [0]

    def slots(n: int) -> list[harness.Slot]:
        start = cursor[0]
        cursor[0] += n
        return [
            (harness.lease(1, start + i), 0, prompts[(start + i) % len(prompts)]) for i in range(n)
        ]

    cells: dict[tuple[str, float], Cell] = {}
    errors: dict[tuple[str, float], ErrorRow] = {}
    for dtype in args.dtypes:
        thresholds = calibrated.thresholds_for(dtype)
        for logit_scale in LOGIT_SCALES:
            path = str(work / f"tiny-x{logit_scale:g}")

            worker = RecordingBackend()
            worker.load(path, dtype=dtype)
            validator = TorchBackend()
            validator.load(path, dtype=dtype)
            eos = worker.eos_token_ids
            no_cache = RecordingBackend(use_kv_cache=False)
            no_cache.attach(worker.model, dtype=dtype, eos_token_ids=eos)
            eager_model: Any = AutoModelForCausalLM
            eager = RecordingBackend()
            eager.attach(
                eager_model.from_pretrained(
                    path, attn_implementation="eager", dtype=getattr(torch, dtype)
                ),
                dtype=dtype,
                eos_token_ids=eos,
            )
            # (name, worker, rollouts, generation batch, validator batch, threads)
            variations: list[tuple[str, RecordingBackend, int, int, int, int]] = [
                ("batched", worker, count(64), 64, 64, 1),
                ("2 threads", worker, count(64), 64, 64, 2),
                ("single sequence", worker, count(16), 1, 64, 1),
                ("no KV cache", no_cache, count(64), 64, 64, 1),
                ("eager attention", eager, count(64), 64, 64, 1),
                ("single prefill", worker, count(64), 64, 1, 1),
            ]
            error = errors.setdefault((dtype, logit_scale), ErrorRow())
            for temperature in args.temperatures:
                cell = cells.setdefault((dtype, temperature), Cell())
                factory = harness.RolloutFactory(
                    temperature, args.max_new_tokens, worker.eos_token_ids
                )
                for _name, generator, n, batch, validator_batch, threads in variations:
                    run_honest(
                        factory,
                        generator,
                        validator,
                        slots(n),
                        batch=batch,
                        validator_batch=validator_batch,
                        threads=threads,
                        thresholds=thresholds,
                        dtype=dtype,
                        cell=cell,
                        error=error,
                    )
            print(
                f"  done: {dtype} logits x{logit_scale:g} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )

    print_report(args, cells, errors, time.perf_counter() - started)


def run_honest(
    factory: harness.RolloutFactory,
    worker: RecordingBackend,
    validator: TorchBackend,
    slot_list: Sequence[harness.Slot],
    *,
    batch: int,
    validator_batch: int,
    threads: int,
    thresholds: calibrated.Thresholds,
    dtype: str,
    cell: Cell,
    error: ErrorRow,
) -> None:
    """Generate honest rollouts, validate them as the validator does, and record every figure."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generated = []
        decode_logits: list[np.ndarray] = []
        for start in range(0, len(slot_list), batch):
            slot_chunk = slot_list[start : start + batch]
            worker.steps = []
            part = factory.generate(worker, slot_chunk, batch_size=batch)
            steps = worker.steps
            for row, item in enumerate(part):
                n = len(item[0].completion_ids)
                decode_logits.append(np.stack([steps[k][row] for k in range(n)]))
            generated.extend(part)
    finally:
        torch.set_num_threads(previous)
    rollouts = []
    behaviour = []
    for generation, lease_binding, index, prompt in generated:
        claim = harness.seal(
            prompt,
            generation.completion_ids,
            finish_reason=generation.finish_reason,
            proof=generation.proof,
            seed=derive_sampling_seed(lease_binding.network_id, lease_binding.task_id, index),
            lease_binding=lease_binding,
            rollout_index=index,
        )
        rollouts.append(harness.Rollout(claim, factory.assignment(lease_binding, prompt)))
        # The wire format: float32 (Rollout.behaviour_logprobs is `repeated float`).
        behaviour.append(np.asarray(generation.logprobs, dtype=np.float32).astype(np.float64))
    for start in range(0, len(rollouts), validator_batch):
        chunk = rollouts[start : start + validator_batch]
        prefills = validator.prefill_batch(
            [(r.assignment.assigned_prompt_ids, r.claim.completion_ids) for r in chunk]
        )
        reports = harness.verify_prefilled(chunk, prefills, thresholds)
        for offset, (rollout, prefill, report) in enumerate(
            zip(chunk, prefills, reports, strict=True)
        ):
            number = start + offset
            cell.rollouts += 1
            cell.tokens += len(rollout.claim.completion_ids)
            reasons = [
                f"{c.name.value}:{c.reason.value if c.reason else '?'}" for c in report.failed
            ]
            sampling = report.check(CheckName.SAMPLING).figures
            if rollout.claim.completion_ids:
                ratios = sampling_margins(
                    prefill.logits,
                    rollout.claim.completion_ids,
                    rollout.claim.sampling_seed,
                    rollout.assignment.temperature,
                ) / sampling_tolerances(prefill.logits, rollout.assignment.temperature, thresholds)
                in_band = (np.abs(ratios) > NEAR_TIE_FLOOR) & (np.abs(ratios) <= 1)
                cell.band_events += int(in_band.sum())
                cell.band_losses += int((in_band & (ratios < 0)).sum())
            cell.worst_margin = min(cell.worst_margin, float(sampling["min_margin"]))
            cell.worst_fraction = min(cell.worst_fraction, float(sampling["min_margin_fraction"]))
            termination = report.check(CheckName.TERMINATION).figures
            if "eos_probability" in termination:
                cell.eos_endings += 1
                if float(sampling["final_margin"]) >= float(sampling["final_tolerance"]):
                    cell.eos_won_clearly += 1
            bounds = token_logprob_bounds(
                prefill.logits,
                rollout.claim.completion_ids,
                rollout.assignment.temperature,
                thresholds,
            )
            claimed = behaviour[number]
            if not bounds.contains(claimed).all():
                reasons.append("behaviour_logprobs:LOGPROBS_MISMATCH")
            fixed = FIXED_TOLERANCE[dtype]
            eos_probability = termination.get("eos_probability")
            fixed_eos_reject = (
                eos_probability is not None
                and float(sampling["final_margin"]) < fixed
                and float(eos_probability) < thresholds.min_eos_probability
            )
            if (
                float(sampling["min_margin"]) < -fixed
                or float(np.abs(claimed - bounds.values).max()) > fixed
                or fixed_eos_reject
            ):
                cell.fixed_rule_rejects += 1
            cell.worst_logprob_fraction = max(
                cell.worst_logprob_fraction, float(bounds.excess(claimed).max())
            )
            for reason in reasons:
                cell.rejects[reason] = cell.rejects.get(reason, 0) + 1
            # The error model itself: worker decode logits vs. validator prefill logits.
            z_validator = prefill.logits.astype(np.float64)
            delta = decode_logits[number].astype(np.float64) - z_validator
            spread = delta.max(axis=1) - delta.min(axis=1)
            magnitude = np.abs(z_validator).max(axis=1)
            tolerance = logit_tolerances(z_validator, thresholds)
            error.rows += spread.size
            error.max_magnitude = max(error.max_magnitude, float(magnitude.max()))
            error.worst_spread = max(error.worst_spread, float(spread.max()))
            error.worst_relative = max(error.worst_relative, float((spread / magnitude).max()))
            error.worst_fraction = max(error.worst_fraction, float((spread / tolerance).max()))


def print_report(
    args: argparse.Namespace,
    cells: dict[tuple[str, float], Cell],
    errors: dict[tuple[str, float], ErrorRow],
    elapsed: float,
) -> None:
    scales = "/".join(f"{s:g}" for s in LOGIT_SCALES)
    print(
        f"\n# rollnet temperature calibration (tiny model, logits x{scales}, "
        f"max_new_tokens={args.max_new_tokens}, torch {torch.__version__}, CPU, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    print("\n## Error model: worker decode logits vs. validator prefill logits, per row")
    print(
        "| dtype | logits | rows | max abs(z) | worst abs(Δ(z_i - z_j)) | "
        "worst / max abs(z) | worst / logit tolerance |"
    )
    print("|---|---|---|---|---|---|---|")
    for (dtype, scale), e in errors.items():
        print(
            f"| {dtype} | x{scale:g} | {e.rows} | {e.max_magnitude:.3g} | {e.worst_spread:.3g} | "
            f"{e.worst_relative:.3g} | {e.worst_fraction:.3f} |"
        )
    print("\n## Honest rollouts per dtype x temperature (calibrated thresholds)")
    print(
        "| dtype | T | rollouts | tokens | false rejects | worst margin (score units) | "
        "worst margin / tolerance | worst log-prob / tolerance | EOS endings (won clearly) | "
        "fixed tolerance of before: rejects | band losses / band events |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    totals: dict[str, tuple[int, int, int]] = {}
    for (dtype, temperature), c in cells.items():
        rejected = sum(c.rejects.values())
        reasons = ", ".join(f"{k} ({v})" for k, v in sorted(c.rejects.items()))
        print(
            f"| {dtype} | {temperature:g} | {c.rollouts} | {c.tokens} | "
            f"{rejected}{' ' + reasons if reasons else ''} | {c.worst_margin:.3g} | "
            f"{c.worst_fraction:.3f} | {c.worst_logprob_fraction:.3f} | "
            f"{c.eos_endings} ({c.eos_won_clearly}) | {c.fixed_rule_rejects} "
            f"| {c.band_losses} / {c.band_events} |"
        )
        r, t, f = totals.get(dtype, (0, 0, 0))
        totals[dtype] = (r + c.rollouts, t + c.tokens, f + rejected)
    for dtype, (r, t, f) in totals.items():
        print(f"\n{dtype}: {r} honest rollouts, {t} tokens, {f} false rejects")
    print(f"\ncalibration took {elapsed:.1f} s")


if __name__ == "__main__":
    main()

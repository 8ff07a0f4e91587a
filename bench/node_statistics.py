"""Per-node statistics on the tiny model: honest false flags and detection vs token budget.

Generates honest rollouts under the calibration harness's honest variations, at task temperatures
across the admitted range (0.001-2.0), and rollouts of each attack that per-token checks pass on
bf16 networks (cheaper models, a stale checkpoint, a sharper sampler, steering to a digit or to
EOS), per network dtype (worker and validator both in it). The validator's
per-rollout statistics (:mod:`rollnet.sdk.proofs.statistics`) are then fed, in verdicts of
``--job-rollouts`` rollouts, to the per-node sequential tests as the coordinator runs them:
nodes are streams of rollouts drawn with replacement from a scenario's pool, and the table
prints the share flagged within each token budget, plus the honest false-flag count over many
honest node streams (drawing from every temperature's honest rollouts), the honest band-loss
share per temperature, and what an EOS steerer changes in completion length (the same seeds and
prompts generated honestly and steered).

    .venv/bin/python bench/node_statistics.py [--scale 1.0] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from rollnet.reference.adversary.cheats import Cheat, CheatingBackend
from rollnet.reference.inference import harness
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.sdk.proofs.logit_figures import token_figures
from rollnet.sdk.proofs.sampling import sampling_margins, token_logprobs
from rollnet.sdk.proofs.statistics import (
    NEAR_TIE_FLOOR,
    NodeEvidence,
    RolloutStatistics,
    StatisticsPolicy,
    judge,
    logprob_dispersion,
    policy_for,
    rollout_statistics_batch,
    rollout_statistics_from_figures,
)
from rollnet.sdk.proofs.thresholds import sampling_tolerances, thresholds_for

BUDGETS = (300, 1_000, 3_000, 10_000, 30_000, 100_000)
HONEST_TEMPERATURES = (0.001, 0.01, 0.1, 0.2, 0.5, 1.5, 2.0)
"""Task temperatures of the honest runs besides the default one (and 0.7)."""
LOGIT_SCALES = ((8.0, (0.2, 1.0, 2.0)), (48.0, (0.2, 1.0, 2.0)))
"""Honest runs on copies whose final norm is scaled (LM-head logits up to max |z| 12 and 54, as
in bench/calibrate_temperature.py), at the temperatures where honest margins came closest to
the band there."""


@dataclass
class Scenario:
    """The per-rollout statistics of one scenario, and whether its rollouts passed per token."""

    name: str
    dtype: str
    honest: bool
    temperature: float
    statistics: list[RolloutStatistics]
    passed_per_token: float
    """Share of rollouts every check accepts (the per-rollout verdict)."""
    ratios: np.ndarray
    """Every token's margin / tolerance (diagnostics: where the losses fall)."""
    accepted: list[bool]
    """Per rollout: whether every check accepts it (only those send statistics)."""
    dispersion: np.ndarray
    """Every token's dispersion ``Y`` (the worker's reported log-probability against the
    validator's; calibration of the dispersion test)."""

    def sent(self) -> list[RolloutStatistics]:
        """The statistics a coordinator receives: those of the accepted rollouts."""
        return [s for s, ok in zip(self.statistics, self.accepted, strict=True) if ok]


def statistics_of(
    validator: TorchBackend,
    rollouts: Sequence[harness.Rollout],
    reported: Sequence[Sequence[float]],
    temperature: float,
    dtype: str,
    *,
    prefill_batch: int = 64,
) -> tuple[list[RolloutStatistics], list[bool], np.ndarray, np.ndarray]:
    """The validator's statistics of ``rollouts`` (``reported``: the worker's log-probabilities
    of each), whether every check accepts each, each token's margin / tolerance and each
    token's dispersion ``Y``."""
    thresholds = thresholds_for(dtype)
    eos = validator.eos_token_ids
    out: list[RolloutStatistics] = []
    ratios: list[np.ndarray] = []
    dispersion: list[np.ndarray] = []
    accepted: list[bool] = []
    for start in range(0, len(rollouts), 64):
        chunk = rollouts[start : start + 64]
        claimed = reported[start : start + 64]
        previous_chunk = validator.prefill_chunk
        validator.prefill_chunk = prefill_batch
        try:
            prefills = validator.prefill_batch(
                [(r.assignment.assigned_prompt_ids, r.claim.completion_ids) for r in chunk]
            )
        finally:
            validator.prefill_chunk = previous_chunk
        logits = [p.logits for p in prefills]
        completions = [r.claim.completion_ids for r in chunk]
        seeds = [r.claim.sampling_seed for r in chunk]
        figures = token_figures(
            logits,
            completions,
            seeds=seeds,
            temperature=temperature,
            thresholds=thresholds,
            eos_token_ids=eos,
        )
        out.extend(rollout_statistics_from_figures(figures, logits, completions, seeds, claimed))
        dispersion.append(
            logprob_dispersion(
                np.concatenate([np.asarray(c, dtype=np.float64) for c in claimed]),
                figures.logprobs,
                figures.others,
                figures.tolerances,
            )
        )
        reports = harness.verify_prefilled(chunk, prefills, thresholds)
        # The validator's log-probability check too: every reported log-probability inside
        # its honest interval (what the pipeline's LOGPROBS check requires).
        inside = [
            bool(figures.logprob_bounds(i).contains(np.asarray(c, dtype=np.float64)).all())
            for i, c in enumerate(claimed)
        ]
        accepted.extend(report.accepted and ok for report, ok in zip(reports, inside, strict=True))
        for rollout, prefill in zip(chunk, prefills, strict=True):
            margins = sampling_margins(
                prefill.logits,
                rollout.claim.completion_ids,
                rollout.claim.sampling_seed,
                temperature,
            )
            ratios.append(margins / sampling_tolerances(prefill.logits, temperature, thresholds))
    return out, accepted, np.concatenate(ratios), np.concatenate(dispersion)


def flag_tokens(
    pool: Sequence[RolloutStatistics],
    policy: StatisticsPolicy,
    rng: np.random.Generator,
    *,
    budget: int,
    job_rollouts: int,
) -> int | None:
    """Tokens a node drawing rollouts from ``pool`` had summarized when flagged (or None)."""
    evidence = NodeEvidence()
    while evidence.tokens < budget:
        picks = rng.integers(0, len(pool), size=job_rollouts)
        evidence = evidence.add([pool[i] for i in picks], policy)
        if judge(evidence, policy).flagged:
            return evidence.tokens
    return None


def stretch_z(statistics: Sequence[RolloutStatistics], tokens: int) -> float:
    """The largest ``|S| / sqrt(V)`` of the log-probability excess over consecutive stretches
    of about ``tokens`` tokens (the drift the log-probability tests would see)."""
    worst = 0.0
    excess = variance = 0.0
    count = 0
    for s in statistics:
        excess += s.logprob_excess
        variance += s.logprob_variance
        count += s.tokens
        if count >= tokens:
            if variance > 0:
                worst = max(worst, abs(excess) / math.sqrt(variance))
            excess = variance = 0.0
            count = 0
    return worst


def eos_shortening(
    dtype: str,
    factory: harness.RolloutFactory,
    honest: TorchBackend,
    steering: TorchBackend,
    slots: Sequence[harness.Slot],
) -> tuple[str, int, float, float, float, float]:
    """What an EOS steerer changes: the same slots (prompts, seeds) generated honestly and by
    the steerer; mean completion lengths, their relative change, the share of rollouts cut."""
    honest_lengths = [len(g[0].completion_ids) for g in factory.generate(honest, slots)]
    steered_lengths = [len(g[0].completion_ids) for g in factory.generate(steering, slots)]
    honest_mean = float(np.mean(honest_lengths))
    steered_mean = float(np.mean(steered_lengths))
    shortened = float(
        np.mean([s < h for s, h in zip(steered_lengths, honest_lengths, strict=True)])
    )
    change = steered_mean / honest_mean - 1
    return dtype, len(slots), honest_mean, steered_mean, change, shortened


def _binomial_upper(successes: int, trials: int, alpha: float) -> float:
    """The largest rate ``pi`` with ``P(Binomial(trials, pi) <= successes) >= alpha``."""
    if trials == 0:
        return 1.0
    low, high = successes / trials, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        cdf = sum(
            math.comb(trials, k) * middle**k * (1 - middle) ** (trials - k)
            for k in range(successes + 1)
        )
        low, high = (middle, high) if cdf >= alpha else (low, middle)
    return low


def add_weight_noise(relative: float, seed: int) -> Callable[[Any], None]:
    """Multiply every weight by ``1 + relative * N(0, 1)``."""

    def transform(model: Any) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
                parameter.mul_(1 + relative * noise.to(parameter.dtype))

    return transform


def untie_head(model: Any) -> Any:
    """Give the model its own LM head (a copy of the tied embeddings): the untied variant."""
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    model.config.tie_word_embeddings = False
    return head


def head_noise(relative: float, seed: int) -> Callable[[Any], None]:
    """Untie the head, then multiply its weights by ``1 + relative * N(0, 1)``."""

    def transform(model: Any) -> None:
        head = untie_head(model)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            noise = torch.randn(head.weight.shape, generator=generator, dtype=torch.float32)
            head.weight.mul_(1 + relative * noise.to(head.weight.dtype))

    return transform


def int8_head(model: Any) -> None:
    """Untie the head, then fake-quantize it to int8 per output channel."""
    head = untie_head(model)
    with torch.no_grad():
        weight = head.weight
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        weight.copy_(torch.round(weight / scale).clamp(-127, 127) * scale)


def adam_step(prompts: Sequence[Sequence[int]], lr: float) -> Callable[[Any], None]:
    """One Adam step (the first step moves every weight by ``lr * sign(gradient)``) on a
    language-modelling loss over ``prompts``: the checkpoint after a stale one."""

    def transform(model: Any) -> None:
        dtype = next(model.parameters()).dtype
        model.float()
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[*p, *([0] * (width - len(p)))] for p in prompts])
        labels = torch.tensor([[*p, *([-100] * (width - len(p)))] for p in prompts])
        with torch.enable_grad():
            model.zero_grad()
            model(input_ids=ids, labels=labels).loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.grad is not None:
                    parameter.sub_(lr * torch.sign(parameter.grad))
                    parameter.grad = None
        model.to(dtype)

    return transform


def fp8_kv_cache(model: Any) -> None:
    """Round every key and value projection to float8 e4m3 (per-tensor scale) and back: a
    worker keeping its KV cache in fp8. The keys are rounded before rotary embedding, which
    moves them by the same relative amount."""

    def round_fp8(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        scale = output.detach().abs().amax().float().clamp(min=1e-12) / 448
        quantized = (output.float() / scale).to(torch.float8_e4m3fn).float() * scale
        return quantized.to(output.dtype)

    for layer in model.model.layers:
        layer.self_attn.k_proj.register_forward_hook(round_fp8)
        layer.self_attn.v_proj.register_forward_hook(round_fp8)


def scale_final_norm(factor: float) -> Callable[[Any], None]:
    """Multiply the final norm's weight by ``factor``: logits ``factor`` times larger."""

    def transform(model: Any) -> None:
        with torch.no_grad():
            model.model.norm.weight.mul_(factor)

    return transform


def transformed(base: TorchBackend, transform: Callable[[Any], None]) -> TorchBackend:
    model = copy.deepcopy(base.model)
    transform(model)
    backend = TorchBackend()
    backend.attach(model, dtype=base.dtype, eos_token_ids=base.eos_token_ids)
    return backend


def print_cost(rounds: int = 5) -> None:
    """What the statistics add to a validator's checks: :func:`rollout_statistics_batch` next to
    the sampling check it rides on (same logits), alternating, best of ``rounds``."""
    from rollnet.sdk.proofs.sampling import check_sampling_batch
    from rollnet.sdk.proofs.thresholds import BFLOAT16

    print("\n## Validator cost: statistics vs the sampling check on the same logits")
    print("| vocabulary | rollouts x tokens | sampling check (s) | statistics (s) | ratio |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for vocab, rollouts, tokens in ((101, 64, 48), (32_768, 16, 64), (151_936, 4, 64)):
        logits = [
            rng.normal(0, 2, size=(tokens, vocab)).astype(np.float32) for _ in range(rollouts)
        ]
        ids = [list(rng.integers(0, vocab, size=tokens)) for _ in range(rollouts)]
        seeds = list(range(rollouts))
        best = {"check": math.inf, "stats": math.inf}
        for _ in range(rounds):
            tick = time.perf_counter()
            check_sampling_batch(logits, ids, seeds=seeds, temperature=1.0, thresholds=BFLOAT16)
            best["check"] = min(best["check"], time.perf_counter() - tick)
            tick = time.perf_counter()
            rollout_statistics_batch(logits, ids, seeds=seeds, temperature=1.0, thresholds=BFLOAT16)
            best["stats"] = min(best["stats"], time.perf_counter() - tick)
        print(
            f"| {vocab:,} | {rollouts} x {tokens} | {best['check']:.4f} | {best['stats']:.4f} "
            f"| {best['stats'] / best['check']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply rollout counts")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--job-rollouts", type=int, default=8, help="rollouts per verdict")
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes per attack")
    parser.add_argument("--honest-nodes", type=int, default=2000)
    parser.add_argument(
        "--configuration-nodes",
        type=int,
        default=100,
        help="simulated honest nodes per honest run (a node keeps one configuration)",
    )
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--cost-only", action="store_true", help="only the validator cost table")
    parser.add_argument(
        "--dispersion",
        default="",
        help="mu0,mu1 of the dispersion test instead of the policy's (a sensitivity run)",
    )
    args = parser.parse_args()

    def policy_of(dtype: str) -> StatisticsPolicy:
        policy = policy_for(dtype)
        if not args.dispersion:
            return policy
        mu0, mu1 = (float(x) for x in args.dispersion.split(","))
        return dataclasses.replace(policy, honest_dispersion=mu0, alternative_dispersion=mu1)

    if args.cost_only:
        print_cost()
        return
    started = time.perf_counter()
    torch.set_num_threads(1)

    def count(n: int) -> int:
        return max(1, int(n * args.scale))

    work = Path(tempfile.mkdtemp(prefix="rollnet-node-statistics-"))
    init_tiny_model(work / "tiny", seed=0)
    prompts = harness.random_prompts(8192, seed=23)
    cursor = [0]

    def slots(n: int, node: int) -> list[harness.Slot]:
        start = cursor[0]
        cursor[0] += n
        return [
            (harness.lease(node, start + i), 0, prompts[(start + i) % len(prompts)])
            for i in range(n)
        ]

    temperature = args.temperature
    scenarios: list[Scenario] = []
    shortening: list[tuple[str, int, float, float, float, float]] = []
    for dtype in args.dtypes.split(","):

        def backend(dtype: str = dtype) -> TorchBackend:
            b = TorchBackend()
            b.load(str(work / "tiny"), dtype=dtype)  # type: ignore[arg-type]
            return b

        validator = backend()
        worker = backend()
        factory = harness.RolloutFactory(temperature, args.max_new_tokens, worker.eos_token_ids)

        def run(
            name: str,
            honest: bool,
            generator: TorchBackend,
            n: int,
            *,
            checker: TorchBackend | None = None,
            sample_temperature: float | None = None,
            report_at_task_temperature: bool = False,
            task_temperature: float = temperature,
            batch: int = 64,
            prefill_batch: int = 64,
            threads: int | None = None,
            dtype: str = dtype,
            factory: harness.RolloutFactory = factory,
            validator: TorchBackend = validator,
        ) -> None:
            tick = time.perf_counter()
            previous = torch.get_num_threads()
            if threads is not None:
                torch.set_num_threads(threads)
            if task_temperature != factory.temperature:
                factory = harness.RolloutFactory(
                    task_temperature, factory.max_new_tokens, factory.eos_token_ids
                )
            sampler = factory
            if sample_temperature is not None:
                sampler = harness.RolloutFactory(
                    sample_temperature, factory.max_new_tokens, factory.eos_token_ids
                )
            try:
                generated = sampler.generate(generator, slots(n, node=1), batch_size=batch)
            finally:
                torch.set_num_threads(previous)
            rollouts = []
            reported: list[Sequence[float]] = [generation.logprobs for generation, *_ in generated]
            if report_at_task_temperature:
                # A sampler substitute that reports the log-probabilities of the task's
                # temperature (its own prefill's: it cannot know the validator's numbers).
                prefills = generator.prefill_batch(
                    [(prompt, generation.completion_ids) for generation, _, _, prompt in generated]
                )
                reported = [
                    token_logprobs(p.logits, g.completion_ids, task_temperature).tolist()
                    for p, (g, *_) in zip(prefills, generated, strict=True)
                ]
            for generation, lb, index, prompt in generated:
                claim = harness.seal(
                    prompt,
                    generation.completion_ids,
                    finish_reason=generation.finish_reason,
                    proof=generation.proof,
                    seed=int(generation.seed or 0),
                    lease_binding=lb,
                    rollout_index=index,
                )
                rollouts.append(harness.Rollout(claim, factory.assignment(lb, prompt)))
            stats, accepted, ratios, dispersion = statistics_of(
                checker or validator,
                rollouts,
                reported,
                task_temperature,
                dtype,
                prefill_batch=prefill_batch,
            )
            passed = sum(accepted) / max(1, len(accepted))
            scenarios.append(
                Scenario(
                    name,
                    dtype,
                    honest,
                    task_temperature,
                    stats,
                    passed,
                    ratios,
                    accepted,
                    dispersion,
                )
            )
            tokens = sum(s.tokens for s in stats)
            print(
                f"  {dtype} {name}: {n} rollouts, {tokens} tokens, "
                f"{passed:.0%} accepted per rollout, {time.perf_counter() - tick:.0f} s",
                flush=True,
            )

        no_cache = TorchBackend(use_kv_cache=False)
        no_cache.attach(worker.model, dtype=dtype)
        run("honest: batched", True, worker, count(512))
        run("honest: single sequence", True, worker, count(48), batch=1)
        run("honest: no KV cache", True, no_cache, count(128))
        run("honest: 2 threads", True, worker, count(128), threads=2)
        eager_model: Any = AutoModelForCausalLM.from_pretrained(
            str(work / "tiny"), attn_implementation="eager", dtype=getattr(torch, dtype)
        )
        eager = TorchBackend()
        eager.attach(eager_model, dtype=dtype, eos_token_ids=worker.eos_token_ids)
        run("honest: eager attention", True, eager, count(128))
        run("honest: single prefill", True, worker, count(64), prefill_batch=1)
        run("honest: T=0.7", True, worker, count(256), task_temperature=0.7)
        for honest_temperature in HONEST_TEMPERATURES:
            run(
                f"honest: T={honest_temperature:g}",
                True,
                worker,
                count(128),
                task_temperature=honest_temperature,
            )
        for factor, temperatures in LOGIT_SCALES:
            # Worker and validator both run the scaled checkpoint: it is the honest model here.
            scaled = transformed(worker, scale_final_norm(factor))
            scaled_validator = transformed(validator, scale_final_norm(factor))
            scaled_eager = transformed(eager, scale_final_norm(factor))
            for honest_temperature in temperatures:
                for label, generator in (("", scaled), (", eager", scaled_eager)):
                    run(
                        f"honest: logits x{factor:g}, T={honest_temperature:g}{label}",
                        True,
                        generator,
                        count(96),
                        checker=scaled_validator,
                        task_temperature=honest_temperature,
                    )
        n_attack = count(192)
        run("weights 1% noise", False, transformed(worker, add_weight_noise(0.01, 5)), n_attack)
        run("weights 0.1% noise", False, transformed(worker, add_weight_noise(0.001, 6)), n_attack)
        run("int8 weights", False, transformed(worker, harness.fake_quantize_int8), n_attack)
        run("int8 LM head (untied)", False, transformed(worker, int8_head), n_attack)
        run("LM head 3% noise (untied)", False, transformed(worker, head_noise(0.03, 7)), n_attack)
        run("fp8 KV cache", False, transformed(worker, fp8_kv_cache), n_attack)
        stepped = transformed(validator, adam_step(prompts[:64], 1e-5))
        run("stale checkpoint (Adam lr 1e-5)", False, worker, n_attack, checker=stepped)
        run("sampling at T=0.95", False, worker, n_attack, sample_temperature=0.95 * temperature)
        run(
            "sampling at T=0.95, T=1 log-probs",
            False,
            worker,
            n_attack,
            sample_temperature=0.95 * temperature,
            report_at_task_temperature=True,
        )
        for cheat in (Cheat.STEER_DIGIT, Cheat.STEER_EOS):
            steering = CheatingBackend(cheat)
            steering.load(str(work / "tiny"), dtype=dtype)
            # EOS is seldom a near-tie runner-up on the tiny model: a larger pool for EOS.
            n = count(768) if cheat is Cheat.STEER_EOS else n_attack
            run(f"steering ({cheat.value})", False, steering, n)
        eos_steerer = CheatingBackend(Cheat.STEER_EOS)
        eos_steerer.load(str(work / "tiny"), dtype=dtype)
        shortening.append(
            eos_shortening(dtype, factory, worker, eos_steerer, slots(count(512), node=1))
        )

    rng = np.random.default_rng(0)
    print(f"\nload average {os.getloadavg()[0]:.1f}; {args.job_rollouts} rollouts per verdict")
    print("\n## Per scenario: band events, loss share, EOS events, log-probability z, accepted")
    print(
        "| dtype | scenario | tokens | losses / (losses + wins) "
        "| EOS losses / (losses + passes) | z = S / sqrt(V) | accepted |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in scenarios:
        tokens = sum(x.tokens for x in s.statistics)
        losses = sum(x.near_tie_losses for x in s.statistics)
        wins = sum(x.near_tie_wins for x in s.statistics)
        excess = sum(x.logprob_excess for x in s.statistics)
        variance = sum(x.logprob_variance for x in s.statistics)
        eos_losses = sum(x.eos_near_tie_losses for x in s.statistics)
        eos_passes = sum(x.eos_near_tie_passes for x in s.statistics)
        share = f"{losses}/{losses + wins} = {losses / max(1, losses + wins):.3f}"
        eos_share = f"{eos_losses}/{eos_losses + eos_passes}"
        z = excess / math.sqrt(variance) if variance > 0 else 0.0
        print(
            f"| {s.dtype} | {s.name} | {tokens} | {share} | {eos_share} | {z:+.1f} "
            f"| {s.passed_per_token:.0%} |"
        )

    edges = (-1.0, -0.5, -0.25, -0.1, -0.03, -0.01, 0.0)
    print("\n## Where the chosen token lost (tokens per margin / tolerance bin, per 10^4 tokens)")
    labels = [f"[{a:g}, {b:g})" for a, b in itertools.pairwise(edges)]
    print("| dtype | scenario | < -1 | " + " | ".join(labels) + " | (0, 0.25] | (0.25, 1] |")
    print("|---|---|" + "---|" * (len(labels) + 3))
    for s in scenarios:
        r = s.ratios
        scale = 1e4 / max(1, r.size)
        cells = [np.sum(r < -1)] + [
            np.sum((r >= a) & (r < b)) for a, b in itertools.pairwise(edges)
        ]
        cells += [np.sum((r >= 0) & (r <= 0.25)), np.sum((r > 0.25) & (r <= 1))]
        print(f"| {s.dtype} | {s.name} | " + " | ".join(f"{c * scale:.1f}" for c in cells) + " |")

    print("\n## Detection: share of simulated nodes flagged within each token budget")
    print("| dtype | scenario | " + " | ".join(f"{b:,}" for b in BUDGETS) + " | median tokens |")
    print("|---|---|" + "---|" * (len(BUDGETS) + 1))
    for s in scenarios:
        if s.honest:
            continue
        policy = policy_of(s.dtype)
        pool = s.sent()
        if len(pool) < len(s.statistics) / 2:
            # Most of its work is rejected by the per-rollout checks: slashed and ejected there.
            print(f"| {s.dtype} | {s.name} | " + " | ".join(["rejected"] * len(BUDGETS)) + " | - |")
            continue
        flags = [
            flag_tokens(pool, policy, rng, budget=BUDGETS[-1], job_rollouts=args.job_rollouts)
            for _ in range(args.nodes)
        ]
        caught_by = [
            f"{sum(1 for f in flags if f is not None and f <= b) / len(flags):.0%}" for b in BUDGETS
        ]
        caught = sorted(f for f in flags if f is not None)
        median = f"{caught[len(caught) // 2]:,}" if len(caught) * 2 > len(flags) else "-"
        print(f"| {s.dtype} | {s.name} | " + " | ".join(caught_by) + f" | {median} |")

    print("\n## Honest band and EOS losses per honest run (task temperature, logit scale)")
    print(
        "| dtype | honest run | tokens | band events | band losses | EOS events | EOS losses "
        "| most negative margin / tol | largest |z| of a 5k-token stretch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for s in scenarios:
        if not s.honest:
            continue
        events = sum(x.near_tie_losses + x.near_tie_wins for x in s.statistics)
        losses = sum(x.near_tie_losses for x in s.statistics)
        eos_events = sum(x.eos_near_tie_losses + x.eos_near_tie_passes for x in s.statistics)
        eos_losses = sum(x.eos_near_tie_losses for x in s.statistics)
        print(
            f"| {s.dtype} | {s.name.removeprefix('honest: ')} | {s.ratios.size} | {events} "
            f"| {losses} | {eos_events} | {eos_losses} | {float(s.ratios.min()):.4f} "
            f"| {stretch_z(s.statistics, 5_000):.1f} |"
        )

    print("\n## Honest band losses (pooled honest variations) and the bound on their share")
    print(
        "| dtype | honest tokens | band events | band losses | most negative honest margin / tol "
        "| 99.9% upper bound on the loss share | policy pi0 |"
    )
    print("|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        honest = [s for s in scenarios if s.honest and s.dtype == dtype]
        ratios = np.concatenate([s.ratios for s in honest])
        # Band and EOS events together: an EOS loss is a band loss whose token is EOS.
        events = int(np.sum((np.abs(ratios) > NEAR_TIE_FLOOR) & (np.abs(ratios) <= 1)))
        losses = int(np.sum((ratios >= -1) & (ratios < -NEAR_TIE_FLOOR)))
        worst = float(ratios.min())
        # Exact binomial upper bound: the share pi with P(at most `losses` | pi) = 0.001.
        bound = _binomial_upper(losses, events, 1e-3)
        print(
            f"| {dtype} | {ratios.size} | {events} | {losses} | {worst:.4f} | {bound:.4f} "
            f"| {policy_for(dtype).honest_loss_rate} |"
        )

    print("\n## Log-probability dispersion: mean Y per token (honest runs and attacks)")
    print(
        "| dtype | scenario | tokens | mean Y | mean Y at 1.5x the noise | mean Y at 2x "
        "| policy mu0 / mu1 |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in scenarios:
        y = s.dispersion
        policy = policy_of(s.dtype)
        means = [float(np.mean(np.minimum(k * k * y, 1.0))) if y.size else 0.0 for k in (1, 1.5, 2)]
        print(
            f"| {s.dtype} | {s.name} | {y.size} | "
            + " | ".join(f"{m:.3f}" for m in means)
            + f" | {policy.honest_dispersion} / {policy.alternative_dispersion} |"
        )

    print("\n## Honest nodes: false flags (pooled honest variations, per dtype)")
    print("| dtype | honest rollouts | nodes x tokens | flagged | largest CUSUM / threshold |")
    print("|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        pool = [x for s in scenarios if s.honest and s.dtype == dtype for x in s.sent()]
        policy = policy_of(dtype)
        flagged = 0
        worst = 0.0
        for _ in range(args.honest_nodes):
            evidence = NodeEvidence()
            while evidence.tokens < BUDGETS[-1]:
                picks = rng.integers(0, len(pool), size=args.job_rollouts)
                evidence = evidence.add([pool[i] for i in picks], policy)
                verdict = judge(evidence, policy)
                worst = max(worst, verdict.statistic)
                if verdict.flagged:
                    flagged += 1
                    break
        print(
            f"| {dtype} | {len(pool)} | {args.honest_nodes} x {BUDGETS[-1]:,} | {flagged} "
            f"| {worst:.1f} / {policy.flag_threshold:.1f} |"
        )
    # One configuration's pool is ~5,000 tokens: a node drawing 100,000 tokens from it with
    # replacement turns the pool's own sampling error in the log-probability excess into a
    # steady drift (a pool at z = +2.4 is "flagged" by logprob_high), so only the dispersion
    # test, whose reference is a bound on each configuration's mean, is judged per run here.
    print("\n## Honest nodes that keep one configuration: the dispersion test per honest run")
    print(
        "| dtype | honest run | nodes x tokens | flagged by dispersion | largest dispersion CUSUM |"
    )
    print("|---|---|---|---|---|")
    for s in scenarios:
        pool = s.sent()
        if not s.honest or not pool:
            continue
        policy = policy_of(s.dtype)
        flagged = 0
        worst_dispersion = 0.0
        for _ in range(args.configuration_nodes):
            evidence = NodeEvidence()
            while evidence.tokens < BUDGETS[-1]:
                picks = rng.integers(0, len(pool), size=args.job_rollouts)
                evidence = evidence.add([pool[i] for i in picks], policy)
                worst_dispersion = max(worst_dispersion, evidence.dispersion_cusum)
                if evidence.dispersion_cusum >= policy.flag_threshold:
                    flagged += 1
                    break
        print(
            f"| {s.dtype} | {s.name.removeprefix('honest: ')} "
            f"| {args.configuration_nodes} x {BUDGETS[-1]:,} | {flagged} "
            f"| {worst_dispersion:.1f} / {policy.flag_threshold:.1f} |"
        )

    print("\n## EOS steering: completion length, steered vs honest (same prompts and seeds)")
    print(
        "| dtype | rollouts | honest mean length | steered mean length | change "
        "| rollouts shortened |"
    )
    print("|---|---|---|---|---|---|")
    for dtype, n, honest_mean, steered_mean, change, shortened in shortening:
        print(
            f"| {dtype} | {n} | {honest_mean:.2f} | {steered_mean:.2f} | {change:+.2%} "
            f"| {shortened:.2%} |"
        )
    print_cost()
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()

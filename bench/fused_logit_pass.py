"""The validator's per-token figures: the separate checks' passes vs ``token_figures``' one pass.

Per vocabulary size, on random float32 logits of ``--rollouts`` rollouts of ``--tokens`` tokens:
the sampling check, the EOS probability bounds, the per-node statistics and the per-rollout
log-probability bounds as the validator ran them before (four walks over ``[tokens, V]``), and
:func:`rollnet.sdk.proofs.logit_figures.token_figures` followed by the same checks' results
from its figures. The variants take turns for ``--repeats`` rounds; the best round of each
counts, and the ratio is printed. Also the float64 softmax block vs a float32 one (measured
only: the checks keep float64 where figures are compared).

    .venv/bin/python bench/fused_logit_pass.py [--rollouts 32 --tokens 64 --repeats 5]

Then the noise bounds (``token_figures`` computes the seeded noise only for the columns that
can still beat a lower bound on the best other score) against the same pass with every
column's noise, taking turns, on three logit shapes per vocabulary, honestly synthetic:
``flat`` (Gaussian, std 0.6: what the bench models' random weights give), ``peaked`` (a
trained model's shape: a Gaussian bulk, std 2, and four plausible tokens ~28 above it) and
``gaussian`` (std 4: neither bound helps), with honest Gumbel-max draws as the tokens:

    .venv/bin/python bench/fused_logit_pass.py --bounds-only --vocab 32000 151936 --tokens 16
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

from rollnet.sdk.proofs import logit_figures, sampling, statistics, termination
from rollnet.sdk.proofs.logit_figures import token_figures
from rollnet.sdk.proofs.thresholds import FLOAT32

EOS = frozenset({0})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", type=int, nargs="*", default=[101, 4096, 32768])
    parser.add_argument("--bounds-only", action="store_true", help="only the noise bounds part")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if not args.bounds_only:
        for vocab in args.vocab:
            _measure(vocab, args, rng)
    print(f"noise bounds vs every column's noise (load average {_load()}):")
    for vocab in args.vocab:
        for shape in ("flat", "peaked", "gaussian"):
            _measure_bounds(vocab, shape, args, rng)
    print(f"load average after: {_load()}")


def _load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def _measure_bounds(
    vocab: int, shape: str, args: argparse.Namespace, rng: np.random.Generator
) -> None:
    logits = []
    ids = []
    for seed in range(args.rollouts):
        if shape == "flat":
            z = rng.standard_normal((args.tokens, vocab)) * 0.6
        elif shape == "gaussian":
            z = rng.standard_normal((args.tokens, vocab)) * 4.0
        else:
            z = rng.standard_normal((args.tokens, vocab)) * 2.0
            for row in z:
                row[rng.choice(vocab, 4, replace=False)] += 28.0 + rng.standard_normal(4)
        logits.append(z.astype(np.float32))
        ids.append(sampling.gumbel_scores(logits[-1], seed, 1.0).argmax(axis=1).tolist())
    seeds = list(range(args.rollouts))
    figures = {}

    def run(name: str) -> None:
        figures[name] = token_figures(
            logits, ids, seeds=seeds, temperature=1.0, thresholds=FLOAT32, eos_token_ids=EOS
        )

    def every_column() -> None:
        with logit_figures.without_noise_bounds():
            run("every_column")

    best = _best_of(
        {"bounds": lambda: run("bounds"), "every_column": every_column}, args.repeats, cpu=True
    )
    same = np.array_equal(figures["bounds"].margins, figures["every_column"].margins)
    per_entry = 1e9 / (args.rollouts * args.tokens * vocab)
    print(
        f"  V={vocab:6d} {shape:8s}: every column {best['every_column'] * per_entry:5.2f} ns, "
        f"bounds {best['bounds'] * per_entry:5.2f} ns CPU per entry -> "
        f"{best['every_column'] / best['bounds']:.2f}x; margins identical: {same}"
    )


def _measure(vocab: int, args: argparse.Namespace, rng: np.random.Generator) -> None:
    logits = [
        (rng.standard_normal((args.tokens, vocab)) * 3).astype(np.float32)
        for _ in range(args.rollouts)
    ]
    ids = [rng.integers(1, vocab, args.tokens).tolist() for _ in range(args.rollouts)]
    seeds = list(range(args.rollouts))

    def separate() -> None:
        sampling.check_sampling_batch(logits, ids, seeds=seeds, temperature=1.0, thresholds=FLOAT32)
        last = np.stack([z[-1] for z in logits])
        termination.eos_probability_bounds(last, EOS, 1.0, FLOAT32)
        statistics.rollout_statistics_batch(
            logits, ids, seeds=seeds, temperature=1.0, thresholds=FLOAT32, eos_token_ids=EOS
        )
        for z, c in zip(logits, ids, strict=True):
            sampling.token_logprob_bounds(z, c, 1.0, FLOAT32)

    def fused() -> None:
        figures = token_figures(
            logits, ids, seeds=seeds, temperature=1.0, thresholds=FLOAT32, eos_token_ids=EOS
        )
        sampling.sampling_results(figures)
        statistics.rollout_statistics_from_figures(figures, logits, ids, seeds)
        for number in range(args.rollouts):
            figures.eos_probability_bounds(number)
            figures.logprob_bounds(number)

    block = np.concatenate(logits)[: max(1, (1 << 18) // vocab)]

    def softmax64() -> None:
        shifted = block.astype(np.float64)
        shifted -= shifted.max(axis=1, keepdims=True)
        np.exp(shifted).sum(axis=1)

    def softmax32() -> None:
        shifted = block - block.max(axis=1, keepdims=True)
        np.exp(shifted).sum(axis=1, dtype=np.float64)

    best = _best_of({"separate": separate, "fused": fused}, args.repeats)
    soft = _best_of({"f64": softmax64, "f32": softmax32}, args.repeats * 20)
    tokens = args.rollouts * args.tokens
    print(
        f"V={vocab:6d} {tokens} tokens: separate {best['separate'] * 1e3:8.2f} ms, "
        f"fused {best['fused'] * 1e3:8.2f} ms -> "
        f"separate / fused {best['separate'] / best['fused']:.2f}x; "
        f"softmax block f64 / f32 {soft['f64'] / soft['f32']:.2f}x"
    )


def _best_of(
    variants: dict[str, Callable[[], None]], repeats: int, *, cpu: bool = False
) -> dict[str, float]:
    clock = time.process_time if cpu else time.perf_counter
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeats):
        for name, run in variants.items():
            started = clock()
            run()
            best[name] = min(best[name], clock() - started)
    return best


if __name__ == "__main__":
    main()

"""Proof size, proof-generation overhead and verification speed on the tiny model (CPU).

Prints, measured side by side in one run:
1. proof bytes per completion token;
2. decode time with plain multinomial sampling, with seeded Gumbel-max sampling, and with
   Gumbel-max plus TOPLOC proofs (built inline, and on a background thread), as ratios;
3. verification (batched re-prefill + every check) vs. generation time for 256-token
   completions.

    .venv/bin/python bench/proofs_benchmark.py [--batch 1 8 64] [--tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from rollnet.reference.inference import Prefill, SamplingParams, harness
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.sdk.proofs import toploc
from rollnet.sdk.proofs.thresholds import FLOAT32


def interleaved(repeats: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best wall time per variant, the variants taking turns so that load changes hit all."""
    for run in runs.values():
        run()  # warm-up
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


class EncodeTimer:
    """Accumulates the time spent committing windows (wraps ``toploc.encode_windows``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._original = toploc.encode_windows

    def __enter__(self) -> EncodeTimer:
        def timed(*args: Any, **kwargs: Any) -> list[bytes]:
            # CPU time of the calling thread: unaffected by waiting for a busy CPU.
            started = time.thread_time()
            try:
                return self._original(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - started

        toploc.encode_windows = timed
        return self

    def __exit__(self, *exc: object) -> None:
        toploc.encode_windows = self._original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = Path(tempfile.mkdtemp(prefix="rollnet-bench-")) / "tiny"
    init_tiny_model(model_dir, seed=0)
    inline = TorchBackend(proof_threads=0)
    inline.load(str(model_dir))
    threaded = TorchBackend(proof_threads=1)
    threaded.attach(inline.model)
    validator = TorchBackend()
    validator.load(str(model_dir))
    # EOS does not end a sequence here, so every completion has exactly --tokens tokens.
    for backend in (inline, threaded):
        backend._eos_ids = frozenset()

    print(
        f"# proofs benchmark (tiny model, CPU, {args.threads} thread(s), torch {torch.__version__})"
    )
    per_token = toploc.PROOF_BYTES / toploc.WINDOW
    window = f"{toploc.PROOF_BYTES} B per {toploc.WINDOW}-token window"
    print(f"\nproof bytes per token: {per_token:.3f} ({window})")
    print(f"256-token completion: {toploc.proof_size(256)} B of proof\n")

    print(
        "| batch | plain multinomial (s) | Gumbel (x plain) | + proofs inline (x Gumbel) "
        "| + proofs on a thread (x Gumbel) | window-commit CPU time / decode CPU time |"
    )
    print("|---|---|---|---|---|---|")
    for batch in args.batch:
        prompts = harness.random_prompts(batch, seed=batch)
        seeds = list(range(batch))

        def generate(
            backend: TorchBackend,
            gumbel: bool,
            proofs: bool,
            prompts: list[list[int]] = prompts,
            seeds: list[int] = seeds,
        ) -> None:
            params = SamplingParams(
                max_new_tokens=args.tokens, seeds=seeds, gumbel=gumbel, proofs=proofs
            )
            backend.generate(prompts, params)

        times = interleaved(
            args.repeats,
            {
                "plain": lambda: generate(inline, False, False),
                "gumbel": lambda: generate(inline, True, False),
                "inline": lambda: generate(inline, True, True),
                "thread": lambda: generate(threaded, True, True),
            },
        )
        with EncodeTimer() as timer:
            started = time.process_time()
            generate(inline, True, True)
            decode = time.process_time() - started - timer.seconds
        plain, gumbel = times["plain"], times["gumbel"]
        print(
            f"| {batch} | {plain:.3f} | {gumbel / plain:.3f} | {times['inline'] / gumbel:.3f} | "
            f"{times['thread'] / gumbel:.3f} | {100 * timer.seconds / decode:.1f}% |"
        )

    print("\n## Verification vs. generation, 256-token completions")
    print(
        "| batch | generate (s) | verify: prefill (s) | verify: checks (s) | verify total (s) "
        "| speed-up |"
    )
    print("|---|---|---|---|---|---|")
    for batch in args.batch:
        prompts = harness.random_prompts(batch, seed=batch)
        factory = harness.RolloutFactory(1.0, args.tokens, frozenset())
        slots = [(harness.lease(0, i), 0, p) for i, p in enumerate(prompts)]
        rollouts = factory.honest(threaded, slots, batch_size=batch)
        pairs = [(r.assignment.assigned_prompt_ids, r.claim.completion_ids) for r in rollouts]
        prefills = validator.prefill_batch(pairs)

        def checks(
            rollouts: list[harness.Rollout] = rollouts, prefills: list[Prefill] = prefills
        ) -> None:
            # What the validator runs: every check of every rollout, vectorized across the batch.
            harness.verify_prefilled(rollouts, prefills, FLOAT32)

        times = interleaved(
            args.repeats,
            {
                "generate": partial(factory.honest, threaded, slots, batch_size=batch),
                "prefill": partial(validator.prefill_batch, pairs),
                "checks": checks,
            },
        )
        generate_time, prefill_time, checks_time = (
            times["generate"],
            times["prefill"],
            times["checks"],
        )
        total_time = prefill_time + checks_time
        reports = harness.validate(validator, rollouts, FLOAT32, batch_size=batch)
        assert all(r.accepted for r in reports), [r.summary() for r in reports if not r.accepted]
        print(
            f"| {batch} | {generate_time:.3f} | {prefill_time:.3f} | "
            f"{checks_time:.3f} | {total_time:.3f} | "
            f"{generate_time / total_time:.1f}x |"
        )


if __name__ == "__main__":
    main()

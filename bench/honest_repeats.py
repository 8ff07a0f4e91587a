"""How often honest rollouts repeat each other, and how likely the repeated completions are: the
figures behind the copy threshold (``rollnet.reference.coordinator.copies.COPY_LOGPROB_MAX``).

The demo's setting: the tiny model warm-started on the ``reverse`` environment's format (as
``rollnet demo`` does), temperature 1, 12 new tokens, 8 samples per prompt. Each prompt is
sampled by several tasks (the seeds are the task's, so each task draws its own), as when a prompt
recurs across demands. Prints the repeats (same prompt and completion, another sample or task),
the log-probability of the most improbable repeat, how many repeats the threshold would refuse
(must be 0), and the share of completions improbable enough to be protected against copying.
Run: ``.venv/bin/python bench/honest_repeats.py [--prompts 64 --tasks 4]``.
"""

from __future__ import annotations

import argparse
import collections
import math
import tempfile
import time
from pathlib import Path

import torch

from rollnet.reference.coordinator.copies import COPY_LOGPROB_MAX
from rollnet.reference.envs import load_environment
from rollnet.reference.inference.base import SamplingParams
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.reference.trainer.warm_start import warm_start
from rollnet.sdk.prompts import encode_problem
from rollnet.sdk.proofs import derive_sampling_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tasks", type=int, default=4, help="tasks sampling each prompt")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--warm-start-steps", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rollnet-repeats-"))
    init_tiny_model(work / "tiny")
    warm_start(
        work / "tiny",
        work / "warm",
        "reverse",
        fmt="copy",
        answer_share=0.1,
        steps=args.warm_start_steps,
    )
    backend = TorchBackend()
    backend.load(str(work / "warm"), dtype="float32")
    tokenizer = CheckpointTokenizer.load(work / "warm")
    environment = load_environment("reverse", {})
    prompts = [encode_problem(tokenizer, environment.prompt(p)) for p in range(args.prompts)]
    seen: dict[tuple[int, tuple[int, ...]], list[float]] = collections.defaultdict(list)
    sums: list[float] = []
    single_eos = 0
    for task in range(args.tasks):
        slots = [(p, s) for p in range(args.prompts) for s in range(args.samples)]
        seeds = [derive_sampling_seed("rollnet-demo", f"task-{task}-{p}", s) for p, s in slots]
        for start in range(0, len(slots), 64):
            generations = backend.generate(
                [prompts[p] for p, _ in slots[start : start + 64]],
                SamplingParams(
                    temperature=1.0,
                    max_new_tokens=args.max_new_tokens,
                    seeds=seeds[start : start + 64],
                    proofs=False,
                ),
            )
            for (p, _), generation in zip(slots[start : start + 64], generations, strict=True):
                total = math.fsum(generation.logprobs)
                sums.append(total)
                seen[(p, generation.completion_ids)].append(total)
                single_eos += len(generation.completion_ids) == 1
    repeats = [(key, values) for key, values in seen.items() if len(values) > 1]
    repeated = sum(len(values) - 1 for _, values in repeats)
    worst = min((min(values) for _, values in repeats), default=float("nan"))
    refused = sum(len(values) - 1 for _, values in repeats if min(values) <= COPY_LOGPROB_MAX)
    protected = sum(total <= COPY_LOGPROB_MAX for total in sums)
    ordered = sorted(sums)
    print(
        f"{len(sums)} honest rollouts ({args.prompts} prompts x {args.tasks} tasks x "
        f"{args.samples} samples), {len(seen)} distinct (prompt, completion) pairs"
    )
    print(f"single-EOS completions: {single_eos}")
    print(f"honest repeats: {repeated} rollouts repeat an earlier one ({len(repeats)} completions)")
    print(f"most improbable repeated completion: log-probability {worst:.2f}")
    print(f"repeats refused at COPY_LOGPROB_MAX = {COPY_LOGPROB_MAX}: {refused}")
    print(
        "completion log-probability quantiles (min, 10%, 50%, 90%, max): "
        + ", ".join(f"{ordered[int(q * (len(ordered) - 1))]:.1f}" for q in (0, 0.1, 0.5, 0.9, 1))
    )
    print(
        f"completions protected against copying (log-probability <= {COPY_LOGPROB_MAX}): "
        f"{protected} of {len(sums)} ({protected / len(sums):.1%})"
    )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()

"""Validated tokens/s vs. generated tokens/s with the tiny model, and the validators:workers ratio.

Both sides run here, one after the other, in one process, with the same torch thread count:

* **worker**: the reference torch backend generates every rollout of ``--jobs`` tasks
  (``--prompts`` × ``--samples`` completions of up to ``--max-new-tokens`` tokens each) with
  seeded Gumbel-max sampling and TOPLOC proofs, as ``rollnet worker`` does;
* **validator**: :func:`rollnet.reference.validator.validate_job` judges each task's batch — blob
  integrity, batch match, binding, assigned data, one batched prefill, TOPLOC, sampling,
  termination and reward recomputation — as ``rollnet validator`` does after fetching the blob.

Generation and validation take turns for ``--repeats`` rounds (the same rollouts each round) and
the best round of each counts, so a change in machine load hits both. It prints both rates, their
ratio (the target is ≥ 10×), and how many validators a swarm needs per worker when every
commitment is validated (new nodes) and at the coordinator's spot-check floor for trusted nodes.

Then the validator against its physical limit, the bare prefill of the same tokens (the
worker's FLOPs, which verification must redo): per job, ``TorchBackend.prefill_batch`` of every
rollout alone, ``validate_job`` end to end (blob digest and decoding, every check, the reward
sandbox, the verdict's messages), and ``validate_job`` under a post-commitment challenge of
``--challenged`` rollouts, taking turns for ``--repeats`` rounds; it prints the ratios (target:
end to end <= 1.25x the bare prefill) and the swarm-level figure, validator-seconds needed per
worker-second at the spot-check floor, with and without the challenge.

Then it runs 1 and 2 validators at once, each a separate process (as ``rollnet validator`` is)
with the same torch thread count, judging disjoint halves of the jobs, and prints the aggregate
validated tokens/s of each. Network time (GetBlob, SubmitVerdict: a few ms per job on loopback)
is not included; it is per job, so it shrinks relative to the work as tasks grow.

Model size: ``--hidden-size``, ``--layers`` and ``--vocab`` grow the tiny model towards the
sizes swarms run (random weights; the cost of a prefill and of the checks depends on the shapes
only). The prefill grows with the parameters, the checks' work outside it with the completion
tokens times the vocabulary, so the end-to-end ratio falls as the model grows
(docs/validator.md, "Against the bare prefill", has the figures per size). A Qwen2.5-0.5B-like
shape on one core takes 2–4 minutes with one small job:

    .venv/bin/python bench/validator_throughput.py [--jobs 8 --prompts 8 --samples 4] \
        [--threads 1] [--repeats 3] [--parallel-rounds 5] [--challenged 8]
    .venv/bin/python bench/validator_throughput.py --jobs 1 --prompts 4 --samples 4 \
        --max-new-tokens 32 --repeats 2 --parallel-rounds 0 \
        --hidden-size 896 --layers 24 --vocab 151936
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from rollnet.reference.coordinator.config import DEFAULT_CHALLENGED_ROLLOUTS
from rollnet.reference.envs import load_environment
from rollnet.reference.inference.base import SamplingParams
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model
from rollnet.reference.testing import validation_job
from rollnet.reference.validator import CheckpointModel, EnvironmentCache, validate_job
from rollnet.sdk import Identity, batches
from rollnet.sdk.prompts import encode_prompt
from rollnet.sdk.proofs import (
    LeaseBinding,
    derive_sampling_seed,
    logit_figures,
    sign_challenge,
    thresholds_for,
)
from rollnet.v1 import common_pb2, rollout_pb2, task_pb2, validation_pb2

NETWORK = "rollnet-bench"
FINISH = {"eos": rollout_pb2.FINISH_REASON_EOS, "length": rollout_pb2.FINISH_REASON_LENGTH}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per task")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--min-validation-rate", type=float, default=0.1)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads, worker and validator"
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds of generate + validate")
    parser.add_argument(
        "--parallel-rounds",
        type=int,
        default=5,
        help="passes over the jobs per validator process (0: skip the several-validators part)",
    )
    parser.add_argument(
        "--hidden-size", type=int, default=0, help="widen the tiny model (default: its own 64)"
    )
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (default: 2)")
    parser.add_argument(
        "--vocab",
        type=int,
        default=0,
        help="widen the embedding and LM head to this many rows (default: the character "
        "tokenizer's 101); ids past the tokenizer decode to nothing, which changes no cost",
    )
    parser.add_argument(
        "--challenged",
        type=int,
        default=DEFAULT_CHALLENGED_ROLLOUTS,
        help="rollouts per job checked in full under a challenge (the coordinator's default)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    root = Path(tempfile.mkdtemp(prefix="rollnet-bench-"))
    spec = TinyModelSpec()
    if args.hidden_size:
        spec = replace(spec, hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size)
    if args.layers:
        spec = replace(spec, num_hidden_layers=args.layers)
    model_dir = init_tiny_model(root / "tiny", seed=0, spec=spec)
    if args.vocab:
        widen_vocabulary(model_dir, args.vocab)
    worker = TorchBackend()
    worker.load(str(model_dir))
    tokenizer = CheckpointTokenizer.load(model_dir)
    model = load_validator_model(model_dir)
    environments = EnvironmentCache()

    generate_seconds = generate_cpu = validate_seconds = validate_cpu = float("inf")
    jobs: list[tuple[validation_pb2.ValidationJob, bytes]] = []
    generate_jobs(worker, tokenizer, args)  # warm-up
    for _ in range(args.repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        jobs = generate_jobs(worker, tokenizer, args)
        generate_seconds = min(generate_seconds, time.perf_counter() - started)
        generate_cpu = min(generate_cpu, time.process_time() - started_cpu)
        validate_job(*jobs[0], model, environments)  # warm-up (first prefill allocates)
        started, started_cpu = time.perf_counter(), time.process_time()
        accepted = sum(validate_job(job, blob, model, environments).accepted for job, blob in jobs)
        validate_seconds = min(validate_seconds, time.perf_counter() - started)
        validate_cpu = min(validate_cpu, time.process_time() - started_cpu)
        if accepted != len(jobs):
            raise SystemExit(f"only {accepted}/{len(jobs)} honest jobs were accepted")
    generated_tokens, prompt_tokens = token_counts(jobs)

    generated_rate = generated_tokens / generate_seconds
    validated_rate = generated_tokens / validate_seconds
    ratio = validated_rate / generated_rate
    rollouts_total = args.jobs * args.prompts * args.samples
    parameters = sum(p.numel() for p in worker.model.parameters())  # the same checkpoint
    print(
        f"torch threads: {torch.get_num_threads()}, tiny model (hidden {spec.hidden_size}, "
        f"{spec.num_hidden_layers} layers, vocabulary {model.backend.vocab_size}, "
        f"{parameters / 1e6:.1f}M parameters), float32, CPU; best of {args.repeats} rounds; "
        f"load average {load_average()}"
    )
    print(
        f"workload: {args.jobs} jobs x {args.prompts} prompts x {args.samples} samples = "
        f"{rollouts_total} rollouts, {generated_tokens} completion + {prompt_tokens} prompt tokens"
    )
    print(
        f"worker   : generated {generated_rate:10.0f} completion tokens/s "
        f"({generate_seconds:.3f} s)"
    )
    print(
        f"validator: validated {validated_rate:10.0f} completion tokens/s "
        f"({validate_seconds:.3f} s; {(generated_tokens + prompt_tokens) / validate_seconds:.0f} "
        f"prompt+completion tokens/s; {len(jobs) / validate_seconds:.1f} jobs/s)"
    )
    print(f"validated / generated: {ratio:.1f}x (target >= 10x)")
    # The worker commits proofs on a background thread, so wall time flatters it on 2+ cores.
    print(
        f"per CPU-second: generated {generated_tokens / generate_cpu:.0f}, validated "
        f"{generated_tokens / validate_cpu:.0f} -> {generate_cpu / validate_cpu:.1f}x"
    )
    floor = args.min_validation_rate
    print(
        f"validators per worker: {1 / ratio:.3f} when every commitment is checked "
        f"(1 validator per {ratio:.1f} workers); {floor / ratio:.4f} at the trusted-node "
        f"spot-check floor {floor:g} (1 validator per {ratio / floor:.0f} workers)"
    )

    print(
        f"\nvalidator vs the bare prefill of the same tokens "
        f"(per job, best of {args.repeats} rounds taking turns):"
    )
    limit = physical_limit(model, environments, jobs, args.repeats, args.challenged)
    prefill = limit["prefill"]
    rollouts_per_job = args.prompts * args.samples
    for name, label in (
        ("prefill", "bare prefill (every rollout)"),
        ("end_to_end", "validate_job, every rollout checked"),
        ("every_column", "the same, noise for every column (no bounds)"),
        ("challenged", f"validate_job, challenge: {args.challenged} of {rollouts_per_job}"),
    ):
        wall, cpu = limit[name]
        print(
            f"  {label:44s} {wall * 1000:8.1f} ms wall ({wall / prefill[0]:.2f}x)  "
            f"{cpu * 1000:8.1f} ms CPU ({cpu / prefill[1]:.2f}x)"
        )
    print(
        f"  end to end / bare prefill: {limit['end_to_end'][0] / prefill[0]:.2f}x wall, "
        f"{limit['end_to_end'][1] / prefill[1]:.2f}x CPU (target <= 1.25x); without the "
        f"noise bounds {limit['every_column'][0] / prefill[0]:.2f}x wall, "
        f"{limit['every_column'][1] / prefill[1]:.2f}x CPU"
    )
    job_generate = generate_seconds / len(jobs)
    for name, label in (("end_to_end", "every rollout"), ("challenged", "challenged")):
        per_worker = limit[name][0] / job_generate
        print(
            f"  validator-seconds per worker-second ({label}): {per_worker:.3f} when every "
            f"commitment is checked, {per_worker * floor:.4f} at the spot-check floor "
            f"{floor:g} (1 validator per {1 / (per_worker * floor):.0f} workers)"
        )

    print(f"  load average after: {load_average()}")
    if args.parallel_rounds < 1:
        return
    print(
        f"\nvalidators at once (processes, {args.threads} torch thread(s) each, CPUs here: "
        f"{multiprocessing.cpu_count()}):"
    )
    wire = [(job.SerializeToString(), blob) for job, blob in jobs]
    rates: dict[int, float] = {}
    for _ in range(2):  # alternate 1 and 2, best of two each
        for count in (1, 2):
            seconds = run_validators(model_dir, wire, count, args.parallel_rounds, args.threads)
            rates[count] = max(
                rates.get(count, 0.0), generated_tokens * args.parallel_rounds / seconds
            )
    for count, rate in rates.items():
        print(
            f"  {count} validator(s): {rate:10.0f} completion tokens/s "
            f"({rate / rates[1]:.2f}x one; {rate / generated_rate:.1f}x one worker)"
        )


def physical_limit(
    model: CheckpointModel,
    environments: EnvironmentCache,
    jobs: Sequence[tuple[validation_pb2.ValidationJob, bytes]],
    repeats: int,
    challenged: int,
) -> dict[str, tuple[float, float]]:
    """Per job, best (wall, CPU) seconds of: the bare batched prefill of every rollout, the
    validator end to end, and the validator under a challenge of ``challenged`` rollouts;
    the three take turns, job by job, for ``repeats`` rounds."""
    coordinator = Identity.from_seed(bytes(range(32, 64)))
    pairs = []
    signed = []
    for job, blob in jobs:
        batch = rollout_pb2.RolloutBatch.FromString(blob)
        # Sorted by length, as the validator prefills them: the least padding.
        pairs.append(
            sorted(
                ((list(r.prompt_token_ids), list(r.completion_token_ids)) for r in batch.rollouts),
                key=lambda pair: len(pair[0]) + len(pair[1]),
            )
        )
        challenge_job = validation_pb2.ValidationJob()
        challenge_job.CopyFrom(job)
        rollouts = len(batch.rollouts)
        challenge_job.challenged_rollouts = min(challenged, rollouts)
        challenge_job.challenge = sign_challenge(
            coordinator.sign,
            job.network_id,
            job.commitment.commitment_id,
            job.commitment.binding_digest,
            rollouts,
            challenge_job.challenged_rollouts,
        )
        signed.append((challenge_job, blob))
    key = coordinator.public_key

    def bare(index: int) -> None:
        model.backend.prefill_batch(pairs[index])

    def end_to_end(index: int) -> None:
        job, blob = jobs[index]
        outcome = validate_job(job, blob, model, environments)
        outcome.to_request(job.job_id, "lease", 1, "request").SerializeToString()
        if not outcome.accepted:
            raise SystemExit(f"honest job {index} was rejected: {outcome.reject_reason}")

    def challenge(index: int) -> None:
        job, blob = signed[index]
        outcome = validate_job(job, blob, model, environments, key)
        outcome.to_request(job.job_id, "lease", 1, "request").SerializeToString()
        if not outcome.accepted:
            raise SystemExit(f"honest job {index} was rejected: {outcome.reject_reason}")

    def every_column(index: int) -> None:
        with logit_figures.without_noise_bounds():
            end_to_end(index)

    variants = {
        "prefill": bare,
        "end_to_end": end_to_end,
        "every_column": every_column,
        "challenged": challenge,
    }
    for run in variants.values():
        run(0)  # warm-up
    best = {name: (float("inf"), float("inf")) for name in variants}
    for _ in range(repeats):
        spent = dict.fromkeys(variants, (0.0, 0.0))
        for index in range(len(jobs)):
            for name, run in variants.items():
                wall, cpu = time.perf_counter(), time.process_time()
                run(index)
                total = spent[name]
                spent[name] = (
                    total[0] + time.perf_counter() - wall,
                    total[1] + time.process_time() - cpu,
                )
        for name, (wall, cpu) in spent.items():
            best[name] = (min(best[name][0], wall / len(jobs)), min(best[name][1], cpu / len(jobs)))
    return best


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages (other work on the machine skews wall times)."""
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def widen_vocabulary(model_dir: Path, vocab: int) -> None:
    """Resize the checkpoint's embedding and LM head to ``vocab`` rows (new rows drawn at
    random), so that the per-token work over the vocabulary is a real model's."""
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model.save_pretrained(model_dir, safe_serialization=True)


def load_validator_model(model_dir: Path) -> CheckpointModel:
    """The validator's loaded checkpoint, as ``rollnet validator`` holds it."""
    validator = TorchBackend()
    validator.load(str(model_dir))
    tokenizer = CheckpointTokenizer.load(model_dir)
    return CheckpointModel(
        step=1, backend=validator, tokenizer=tokenizer, thresholds=thresholds_for("float32")
    )


def generate_jobs(
    worker: TorchBackend, tokenizer: CheckpointTokenizer, args: argparse.Namespace
) -> list[tuple[validation_pb2.ValidationJob, bytes]]:
    """Generate and seal every job's rollouts as a worker does (the same rollouts every call)."""
    environment = load_environment("arithmetic", {})
    sampling = common_pb2.SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    jobs = []
    for number in range(args.jobs):
        task = task_pb2.Task(
            task_id=f"task-{number}",
            environment="arithmetic",
            prompt_ids=[number * args.prompts + p for p in range(args.prompts)],
            samples_per_prompt=args.samples,
            sampling=sampling,
            checkpoint_step=1,
        )
        lease = LeaseBinding(NETWORK, "node", task.task_id, f"lease-{number}", 1)
        problems = [environment.prompt(int(p)) for p in task.prompt_ids]
        prompts = [encode_prompt(tokenizer, problem.prompt) for problem in problems]
        slots = [(p, s) for p in range(args.prompts) for s in range(args.samples)]
        seeds = [derive_sampling_seed(NETWORK, task.task_id, index) for index in range(len(slots))]
        generations = worker.generate(
            [prompts[p] for p, _ in slots],
            SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seeds=seeds),
        )
        rollouts = []
        for index, ((p, s), generation) in enumerate(zip(slots, generations, strict=True)):
            text = tokenizer.decode(list(generation.completion_ids), skip_special_tokens=True)
            reward = environment.reward(problems[p], text, len(generation.completion_ids))
            rollouts.append(
                rollout_pb2.Rollout(
                    prompt_index=p,
                    prompt_id=task.prompt_ids[p],
                    sample_index=s,
                    prompt_token_ids=generation.prompt_ids,
                    completion_token_ids=generation.completion_ids,
                    behaviour_logprobs=generation.logprobs,
                    sampling_seed=seeds[index],
                    finish_reason=FINISH[generation.finish_reason],
                    toploc_proof=generation.proof,
                    claimed_reward=common_pb2.Reward(
                        task_reward=reward.task_reward,
                        length_penalty=reward.length_penalty,
                        total=reward.total,
                    ),
                )
            )
        jobs.append(seal(task, lease, rollouts))
    return jobs


def token_counts(jobs: Sequence[tuple[validation_pb2.ValidationJob, bytes]]) -> tuple[int, int]:
    """Completion and prompt tokens of every job."""
    completion = prompt = 0
    for _, blob in jobs:
        batch = rollout_pb2.RolloutBatch.FromString(blob)
        completion += sum(len(r.completion_token_ids) for r in batch.rollouts)
        prompt += sum(len(r.prompt_token_ids) for r in batch.rollouts)
    return completion, prompt


def run_validators(
    model_dir: Path, wire: list[tuple[bytes, bytes]], count: int, rounds: int, threads: int
) -> float:
    """Wall seconds for ``count`` validator processes to judge ``wire`` ``rounds`` times, the
    jobs split between them; timed from a common start once every process has loaded."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(count)
    results = context.Queue()
    shares = [wire[i::count] for i in range(count)]
    processes = [
        context.Process(
            target=validator_process, args=(model_dir, share, rounds, threads, start, results)
        )
        for share in shares
    ]
    for process in processes:
        process.start()
    spans: list[tuple[float, float, int]] = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    if sum(accepted for _, _, accepted in spans) != len(wire) * rounds:
        raise SystemExit("a validator process rejected honest work")
    return max(end for _, end, _ in spans) - min(begin for begin, _, _ in spans)


def validator_process(
    model_dir: Path,
    share: list[tuple[bytes, bytes]],
    rounds: int,
    threads: int,
    start: Any,
    results: Any,
) -> None:
    """One validator: load the checkpoint, wait for the others, judge its share ``rounds`` times."""
    torch.set_num_threads(threads)
    model = load_validator_model(model_dir)
    environments = EnvironmentCache()
    jobs = [(validation_pb2.ValidationJob.FromString(job), blob) for job, blob in share]
    validate_job(*jobs[0], model, environments)  # warm-up
    start.wait()
    began = time.time()
    accepted = 0
    for _ in range(rounds):
        for job, blob in jobs:
            accepted += validate_job(job, blob, model, environments).accepted
    results.put((began, time.time(), accepted))


def seal(
    task: task_pb2.Task, lease: LeaseBinding, rollouts: list[rollout_pb2.Rollout]
) -> tuple[validation_pb2.ValidationJob, bytes]:
    """The job and blob a coordinator would hand a validator for these rollouts."""
    sealed = batches.seal(lease, task, rollouts)
    request = sealed.request
    job = validation_job(task, lease, request.rollout_batch, request.rollouts)
    return job, sealed.batch


if __name__ == "__main__":
    main()

"""Decode tokens/s of the torch backend on the tiny model, with and without verifiability.

Measured side by side in one run, same prompts, same batch, fixed-length completions (EOS is
suppressed so every mode decodes exactly ``--tokens`` tokens per sequence):

* ``plain``       multinomial sampling, no proofs (what an unverifiable worker would run);
* ``gumbel``      seeded Gumbel-max sampling, no proofs;
* ``proofs``      multinomial sampling with TOPLOC proofs;
* ``verifiable``  seeded Gumbel-max + TOPLOC proofs (what ``rollnet worker`` runs);

plus ``worker``: the reference worker's whole per-task path (environment prompts, tokenizer,
verifiable decode, reward scoring, rollout protos) through ``InferenceGenerator``. Printed:
tokens/s (best of ``--repeats`` interleaved rounds) and each mode's slowdown relative to
``plain``. Nothing is asserted on time.

    .venv/bin/python bench/worker_decode.py [--batch 8 32] [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rollnet.reference.envs import load_environment
from rollnet.reference.inference import SamplingParams, harness
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.client import ConnectionConfig, RollnetClient
from rollnet.sdk.identity import Identity
from rollnet.sdk.worker import LeaseContext
from rollnet.v1 import common_pb2, task_pb2

MODES = {
    "plain": {"gumbel": False, "proofs": False},
    "gumbel": {"gumbel": True, "proofs": False},
    "proofs": {"gumbel": False, "proofs": True},
    "verifiable": {"gumbel": True, "proofs": True},
}


def interleaved_best(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time of each run over ``repeats`` rounds, the runs interleaved in each round.

    Interleaving spreads any background load over every run alike, and the best time is the
    least disturbed one: ratios stay meaningful on a busy machine.
    """
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def worker_run(
    model_dir: Path, batch: int, tokens: int, client: RollnetClient
) -> Callable[[], object]:
    """InferenceGenerator producing one task of ``batch`` rollouts (up to 4 samples a prompt)."""
    store = CheckpointStore(model_dir.parent / "unused", network_id="bench")
    generator = InferenceGenerator(lambda: make_backend("torch"), store, batch_size=batch)
    generator._load(1, model_dir)  # benchmark: load without a coordinator
    backend = generator._backend
    assert isinstance(backend, TorchBackend)
    backend._eos_ids = frozenset()  # fixed-length decode, as in the other modes
    samples = min(4, batch)
    task = task_pb2.Task(
        task_id="bench-task",
        environment="arithmetic",
        prompt_ids=list(range(batch // samples)),
        samples_per_prompt=samples,
        sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=tokens),
        checkpoint_step=1,
    )
    lease = LeaseContext(
        task=task,
        lease=task_pb2.Lease(lease_id="bench-lease", fencing_token=1),
        network_id="bench",
        node_id="bench-node",
        client=client,  # never called: only checkpoint fetches use it
        deadline=time.monotonic() + 3600,
    )
    environment = load_environment("arithmetic", {})
    return functools.partial(generator._generate_blocking, task, lease, environment)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    client = RollnetClient.connect(
        ConnectionConfig(target="127.0.0.1:9", network_id="bench"), Identity.generate()
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_tiny_model(Path(tmp) / "tiny", seed=0)
        backend = TorchBackend()
        backend.load(str(model_dir))
        backend._eos_ids = frozenset()  # fixed-length decode
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tiny model (CPU)")
        print(f"{args.tokens} tokens per completion, best of {args.repeats} interleaved rounds\n")
        names = [*MODES, "worker"]
        print(f"{'batch':>5}  " + "  ".join(f"{m:>18}" for m in names))
        for batch in args.batch:
            prompts = harness.random_prompts(batch, seed=batch)
            seeds = list(range(1, batch + 1))
            runs: dict[str, Callable[[], object]] = {
                mode: functools.partial(
                    backend.generate,
                    prompts,
                    SamplingParams(
                        temperature=1.0, max_new_tokens=args.tokens, seeds=seeds, **flags
                    ),
                )
                for mode, flags in MODES.items()
            }
            runs["worker"] = worker_run(model_dir, batch, args.tokens, client)
            interleaved_best(runs, 1)  # warm-up: first calls pay for lazy initialisation
            seconds = interleaved_best(runs, args.repeats)
            rates = {name: batch * args.tokens / seconds[name] for name in names}
            cells = [f"{rates[m]:>9,.0f} ({rates['plain'] / rates[m]:.2f}x)" for m in names]
            print(f"{batch:>5}  " + "  ".join(f"{c:>18}" for c in cells))
        print("\ntokens/s (slowdown vs plain); 'verifiable' / 'plain' is the overhead of proofs +")
        print("Gumbel-max; 'worker' adds prompts, tokenization, rewards and rollout records.")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())

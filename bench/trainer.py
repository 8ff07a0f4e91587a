"""The trainer against its limits, each side measured in the same run.

1. **step** — the trainer's optimizer step (:class:`rollnet.reference.trainer.learner.Learner`:
   packing, fp32 LM head on the completion positions, the clipped loss with its branch
   statistics, grad-norm clipping, AdamW) against a bare PyTorch forward + backward + AdamW step
   over the *same* packed batch (the model's own logits, log-softmax, ``−A·logπ``): tokens/s of
   each, best of ``--repeats``, and the ratio (target ≥ 0.8×).
2. **async** — the whole local swarm (``rollnet demo``: coordinator, trainer, 2 workers,
   validator, real processes) at ``max_off_policy_steps`` 0 and 2, one after the other: the
   trainer's idle fraction (time waiting for rollouts) and samples/s, read from its metrics.
3. **fsdp** — the same optimizer step under ``torchrun`` with 2 CPU processes (FSDP2, gloo)
   against 1 process: tokens/s of each.

``--device cuda --dtype bfloat16`` runs part 1 on a GPU with the model in bf16 (the LM head is
still computed in fp32 by the trainer; the bare side uses the model's bf16 logits).

    .venv/bin/python bench/trainer.py [--parts step,async,fsdp] [--hidden 256 --layers 4]
        [--sequences 256] [--repeats 5] [--device cpu] [--dtype float32] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model
from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.policy import TrainingSequence, pack


def make_batch(vocab: int, count: int, seed: int = 0) -> list[TrainingSequence]:
    """``count`` sequences shaped like the demo's (prompt ~15 tokens, completion ≤ 12)."""
    draw = random.Random(seed)
    sequences = []
    for _ in range(count):
        prompt = [draw.randrange(4, vocab) for _ in range(draw.randint(11, 17))]
        completion = [draw.randrange(4, vocab) for _ in range(draw.randint(3, 12))]
        logprobs = [-draw.uniform(0.1, 4.0) for _ in completion]
        sequences.append(
            TrainingSequence(prompt, completion, logprobs, logprobs, draw.uniform(-1, 1), 1.0)
        )
    return sequences


def bare_step(model: Any, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    """The limit: the model's forward, log-softmax at the completion positions, backward, step."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    picked = logits.reshape(-1, logits.shape[-1]).index_select(0, batch.positions)
    logprobs = torch.log_softmax(picked.float(), dim=-1)
    chosen = logprobs.gather(1, batch.targets.unsqueeze(1)).squeeze(1)
    loss = -(batch.advantages * chosen).sum() / batch.loss_tokens
    loss.backward()
    optimizer.step()


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def part_step(args: argparse.Namespace, model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rollnet.reference.trainer.learner import Learner

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    config = TrainerConfig(device=args.device, micro_batch_size=args.sequences, grad_clip=1.0)
    learner = Learner(config, model_dir, None, 0)
    learner.model.to(dtype=dtype)
    bare_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device)
    bare_model.train()
    bare_optimizer = torch.optim.AdamW(bare_model.parameters(), lr=1e-4)
    sequences = make_batch(bare_model.config.vocab_size, args.sequences)
    packed = pack(sequences, learner.pad_id, torch.device(args.device))
    tokens = packed.loss_tokens
    trainer_times, bare_times = [], []
    for repeat in range(args.repeats + 1):  # the first round warms up
        _synchronize(args.device)
        started = time.perf_counter()
        learner.step(sequences)
        _synchronize(args.device)
        middle = time.perf_counter()
        bare_step(bare_model, bare_optimizer, packed)
        _synchronize(args.device)
        ended = time.perf_counter()
        if repeat:
            trainer_times.append(middle - started)
            bare_times.append(ended - middle)
    trainer_rate = tokens / min(trainer_times)
    bare_rate = tokens / min(bare_times)
    print(
        f"step ({args.device}, {args.dtype}, {args.sequences} sequences, {tokens} loss tokens, "
        f"{sum(p.numel() for p in bare_model.parameters()):,} parameters):"
    )
    print(f"  bare PyTorch fwd+bwd+AdamW : {bare_rate:>10,.0f} tokens/s")
    print(f"  trainer step               : {trainer_rate:>10,.0f} tokens/s")
    print(f"  ratio                      : {trainer_rate / bare_rate:.2f}x (target >= 0.8x)")


def part_async(args: argparse.Namespace) -> None:
    from rollnet.reference.demo import DemoConfig, run_demo
    from rollnet.reference.trainer.metrics import read_jsonl

    results = {}
    for bound in (0, 2):
        root = Path(tempfile.mkdtemp(prefix=f"rollnet-bench-async{bound}-"))
        config = DemoConfig(
            data_dir=root,
            cheats=(),
            steps=args.async_steps,
            max_off_policy_steps=bound,
            warm_start_steps=100,
        )
        print(f"async: local swarm with max_off_policy_steps={bound} ({root}) ...", flush=True)
        code = asyncio.run(run_demo(config))
        lines = read_jsonl(root / "trainer" / "metrics.jsonl")[1:]  # step 1 waits for start-up
        if code != 0 or not lines:
            print(f"  the swarm run failed (exit {code}); see {root}/logs")
            return
        idle = sum(line["idle_seconds"] for line in lines)
        busy = sum(line["busy_seconds"] for line in lines)
        samples = sum(line["samples"] for line in lines)
        results[bound] = (idle / (idle + busy), samples / (idle + busy))
    print("async (same machine, same swarm, steps 2..N):")
    for bound, (idle, rate) in results.items():
        print(
            f"  max_off_policy_steps={bound}: trainer idle {100 * idle:.0f}%, {rate:.1f} samples/s"
        )
    if len(results) == 2:
        print(f"  samples/s ratio 2 vs 0: {results[2][1] / results[0][1]:.2f}x")


def part_fsdp(args: argparse.Namespace, model_dir: Path) -> None:
    worker = Path(__file__).with_name("_trainer_fsdp.py")
    rates = {}
    for processes in (1, 2):
        out = Path(tempfile.mkstemp(suffix=".json")[1])
        env = dict(os.environ, OMP_NUM_THREADS="1")
        command = [sys.executable]
        if processes > 1:
            command += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
            command += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
        command += [str(worker), str(model_dir), str(out), str(args.sequences), str(args.repeats)]
        subprocess.run(command, env=env, check=True, capture_output=True)
        rates[processes] = json.loads(out.read_text())["tokens_per_s"]
    print(f"fsdp (CPU, gloo, one thread per process, {args.sequences} sequences):")
    print(f"  1 process   : {rates[1]:>10,.0f} tokens/s")
    print(f"  2 processes : {rates[2]:>10,.0f} tokens/s ({rates[2] / rates[1]:.2f}x)")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="step,async,fsdp")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--async-steps", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    model_dir = Path(tempfile.mkdtemp(prefix="rollnet-bench-model-"))
    init_tiny_model(
        model_dir, spec=TinyModelSpec(hidden_size=args.hidden, num_hidden_layers=args.layers)
    )
    if "step" in parts:
        part_step(args, model_dir)
    if "fsdp" in parts:
        part_fsdp(args, model_dir)
    if "async" in parts:
        part_async(args)


if __name__ == "__main__":
    main()

"""One process of bench/trainer.py's FSDP2 part (run alone or under torchrun): times optimizer
steps on a fixed batch; rank 0 writes tokens/s as JSON to ``argv[2]``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from trainer import make_batch

from rollnet.reference.trainer import fsdp
from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.learner import Learner


def main() -> None:
    torch.set_num_threads(1)
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    count, repeats = int(sys.argv[3]), int(sys.argv[4])
    config = TrainerConfig(micro_batch_size=count, grad_clip=1.0)
    learner = Learner(config, model_dir, None, 0)
    sequences = make_batch(learner.model.config.vocab_size, count)
    tokens = sum(len(s.completion_ids) for s in sequences)
    times = []
    for repeat in range(repeats + 1):
        if fsdp.world_size() > 1:
            dist.barrier()
        started = time.perf_counter()
        fsdp.distributed_step(
            learner.policy,
            learner.optimizer,
            learner.scheduler,
            sequences,
            config.loss,
            pad_id=learner.pad_id,
            device=torch.device("cpu"),
            micro_batch_size=config.micro_batch_size,
            grad_clip=config.grad_clip,
        )
        if repeat:
            times.append(time.perf_counter() - started)
    if fsdp.rank() == 0:
        out.write_text(json.dumps({"tokens_per_s": tokens / min(times)}))
    if fsdp.world_size() > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One process of the FSDP2 equivalence test (run by torchrun, or alone): one optimizer step on
a fixed batch; rank 0 writes the loss, grad norm and updated weights to ``argv[2]``."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rollnet.reference.trainer.policy import TrainingSequence


def batch(vocab: int) -> list[TrainingSequence]:
    from rollnet.reference.trainer.policy import TrainingSequence

    draw = random.Random(7)
    sequences = []
    for index in range(8):
        prompt = [draw.randrange(4, vocab) for _ in range(draw.randint(3, 9))]
        completion = [draw.randrange(4, vocab) for _ in range(draw.randint(2, 7))]
        logprobs = [-draw.uniform(0.5, 5.0) for _ in completion]
        sequences.append(
            TrainingSequence(
                prompt_ids=prompt,
                completion_ids=completion,
                behaviour_logprobs=logprobs,
                validated_logprobs=logprobs if index % 3 else None,
                advantage=draw.uniform(-1.0, 1.0),
                temperature=1.0,
            )
        )
    return sequences


def main() -> None:
    from transformers import AutoModelForCausalLM

    from rollnet.reference.trainer import fsdp
    from rollnet.reference.trainer.loss import LossConfig
    from rollnet.reference.trainer.policy import PolicyForward, warmup_lambda

    torch.set_num_threads(1)
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    fsdp.setup("cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    policy = fsdp.shard(PolicyForward(model), model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_lambda(0))
    stats = fsdp.distributed_step(
        policy,
        optimizer,
        scheduler,
        batch(model.config.vocab_size),
        LossConfig(kind="clip"),
        pad_id=1,
        device=torch.device("cpu"),
        micro_batch_size=2,
        grad_clip=1.0,
    )
    state = fsdp.full_state_dict(model)
    if fsdp.rank() == 0:
        torch.save(
            {"loss": stats.loss, "grad_norm": stats.grad_norm, "tokens": stats.loss_tokens,
             "state": state},
            out,
        )  # fmt: skip
    if fsdp.world_size() > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

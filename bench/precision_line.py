"""Where the precision line falls on a float32 network: honest rollouts generated under reduced
float32 GEMM precision, checked by a validator at IEEE float32 ("highest").

Scenarios (the worker differs, the validator is always float32 at "highest"):

* ``highest``: the baseline, IEEE float32 GEMMs.
* ``high`` / ``medium``: ``torch.set_float32_matmul_precision`` while generating. On a CPU,
  PyTorch hands oneDNN "tf32" / "bf16" for float32 matmuls; whether it uses them depends on
  the CPU (the first lines say whether this CPU's logits moved at all).
* ``tf32 emulated``: every linear layer's inputs and weights rounded to TF32 (10 mantissa
  bits, round to nearest even), float32 accumulation: what a GPU does with TF32 on. Attention
  matmuls stay float32, so this understates TF32 a little.
* ``bf16-input emulated``: the same with bfloat16 rounding (7 mantissa bits): what "medium"
  does where oneDNN has bfloat16 GEMMs.

Prints per scenario: rollouts, rejects, and the failed checks. Run:
``.venv/bin/python bench/precision_line.py [--rollouts 64]``.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rollnet.reference.inference import harness
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import init_tiny_model
from rollnet.sdk.proofs.thresholds import FLOAT32


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` (float32) rounded to ``bits`` mantissa bits, to nearest even."""
    drop = 23 - bits
    raw = x.contiguous().view(torch.int32)
    bias = (1 << (drop - 1)) - 1 + ((raw >> drop) & 1)
    return ((raw + bias) & ~((1 << drop) - 1)).view(torch.float32)


def reduced_linears(bits: int) -> Callable[[Any], None]:
    """A model transform: every ``nn.Linear`` multiplies inputs rounded to ``bits`` bits."""

    def transform(model: Any) -> None:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):

                def forward(x: torch.Tensor, m: torch.nn.Linear = module) -> torch.Tensor:
                    weight = round_mantissa(m.weight, bits)
                    return F.linear(round_mantissa(x, bits), weight, m.bias)

                module.forward = forward  # type: ignore[method-assign,assignment]

    return transform


@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=64, help="rollouts per scenario")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rollnet-precision-"))
    init_tiny_model(work / "tiny", seed=0)

    def backend() -> TorchBackend:
        loaded = TorchBackend()
        loaded.load(str(work / "tiny"), dtype="float32")
        return loaded

    worker, validator = backend(), backend()
    factory = harness.RolloutFactory(args.temperature, args.max_new_tokens, worker.eos_token_ids)
    prompts = harness.random_prompts(4096, seed=17)
    probe = torch.tensor([list(prompts[0])])
    with torch.no_grad():
        exact = worker.model(probe).logits
        for precision in ("high", "medium"):
            with matmul_precision(precision):
                moved = (worker.model(probe).logits - exact).abs().max().item()
            print(f"logits moved by precision {precision!r} on this CPU: max |diff| = {moved:.3g}")
    scenarios: dict[str, tuple[TorchBackend, str]] = {
        "highest": (worker, "highest"),
        "high": (worker, "high"),
        "medium": (worker, "medium"),
        "tf32 emulated": (harness.transformed_backend(worker, reduced_linears(10)), "highest"),
        "bf16-input emulated": (
            harness.transformed_backend(worker, reduced_linears(7)),
            "highest",
        ),
    }
    print(f"{'scenario':<22} {'rollouts':>8} {'rejected':>8} {'reject rate':>11}  failed checks")
    for number, (name, (generator, precision)) in enumerate(scenarios.items()):
        slots = [
            (harness.lease(1, number * 10_000 + i), 0, prompts[number * 512 + i])
            for i in range(args.rollouts)
        ]
        with matmul_precision(precision):
            rollouts = factory.honest(generator, slots)
        reports = harness.validate(validator, rollouts, FLOAT32)
        rejected = [r for r in reports if not r.accepted]
        reasons = collections.Counter(
            f"{c.name.value}:{c.reason.value if c.reason else '?'}"
            for r in rejected
            for c in r.failed
        )
        print(
            f"{name:<22} {len(reports):>8} {len(rejected):>8} "
            f"{len(rejected) / len(reports):>11.3f}  {dict(reasons.most_common())}",
            flush=True,
        )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()

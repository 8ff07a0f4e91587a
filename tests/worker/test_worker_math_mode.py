"""A worker refuses to compute a float32 network's work below IEEE float32: TF32 or bfloat16
GEMM inputs (torch.set_float32_matmul_precision "high"/"medium", allow_tf32) are named with
their fix, at start (the CLI) and per task (the task is given back,
FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED). docs/verification.md, "What each network dtype
admits"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from worker_testing import generator_without_backend, offline_lease

from rollnet.reference.cli.errors import CliError
from rollnet.reference.cli.worker import refuse_math_mode
from rollnet.reference.inference.math_mode import math_mode_problems
from rollnet.sdk.worker import LeaseLost
from rollnet.v1 import common_pb2, task_service_pb2


@pytest.fixture(params=["high", "medium"])
def reduced_precision(request: pytest.FixtureRequest) -> Iterator[str]:
    """The process at float32 matmul precision "high" or "medium", restored afterwards."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(request.param)
    try:
        yield str(request.param)
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.fixture
def tf32_cublas() -> Iterator[None]:
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_the_default_math_mode_is_admitted() -> None:
    assert torch.get_float32_matmul_precision() == "highest"
    assert math_mode_problems("float32") == []
    assert math_mode_problems("bfloat16") == []


def test_reduced_matmul_precision_is_named_with_its_fix(reduced_precision: str) -> None:
    problems = math_mode_problems("float32")
    assert problems, reduced_precision
    assert f'torch.get_float32_matmul_precision() is "{reduced_precision}"' in problems[0]
    assert 'torch.set_float32_matmul_precision("highest")' in problems[0]
    # oneDNN (the CPU's GEMMs) is named too: "high" lets it use TF32, "medium" bfloat16.
    onednn = "tf32" if reduced_precision == "high" else "bf16"
    assert any(f'mkldnn.matmul.fp32_precision is "{onednn}"' in p for p in problems), problems
    # A bfloat16 network computes its GEMMs in bfloat16 anyway: nothing to refuse.
    assert math_mode_problems("bfloat16") == []


def test_tf32_cublas_is_refused(tf32_cublas: None) -> None:
    problems = math_mode_problems("float32")
    assert any("TF32" in p and "cuda.matmul" in p for p in problems), problems


def test_the_worker_cli_refuses_to_start(reduced_precision: str) -> None:
    with pytest.raises(CliError, match=r"--dtype float32: .*set_float32_matmul_precision"):
        refuse_math_mode("float32", "cpu")
    refuse_math_mode("bfloat16", "cpu")  # admitted


async def test_the_generator_gives_the_task_back(tmp_path: Path, reduced_precision: str) -> None:
    generator = generator_without_backend(tmp_path)
    lease = offline_lease(common_pb2.COMPUTE_DTYPE_FLOAT32)
    try:
        with pytest.raises(LeaseLost, match=reduced_precision):
            await generator.generate(lease.task, lease)
        assert lease.give_back_reason == task_service_pb2.FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED
        assert "below IEEE float32" in lease.cancel_reason
    finally:
        generator.close()

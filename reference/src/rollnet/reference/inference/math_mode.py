"""The process math mode a network's compute dtype admits (docs/verification.md, "What each
network dtype admits").

On a float32 network the validator's thresholds are calibrated on IEEE float32 GEMMs: TF32
(10-bit mantissa inputs, GPU default in many stacks) and bfloat16 GEMM inputs (what
``torch.set_float32_matmul_precision("medium")`` lets oneDNN use on a CPU, and cuBLAS on a GPU)
move the hidden states past them, so honest work in those modes would be rejected and
slashed. A worker checks its process before generating and refuses, naming the setting.

On a bfloat16 network GEMMs take bfloat16 inputs anyway; what float32 settings say does not
apply to them, and nothing is refused here.
"""

from __future__ import annotations

from typing import Any

from rollnet.reference.inference.base import DType

#: Values of PyTorch's ``fp32_precision`` knobs that mean IEEE float32 ("none" inherits the
#: parent's, which is IEEE unless a parent says otherwise).
_IEEE = frozenset({"ieee", "none"})


def _knob(path: str) -> Any:
    """``torch.backends.<path>``, or None where this PyTorch lacks it."""
    import torch

    node: Any = torch.backends
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def math_mode_problems(dtype: DType, device: str = "cpu") -> list[str]:
    """What in this process's math mode a ``dtype`` network rejects: one line per setting,
    naming it and how to fix it. Empty when the process computes as the network requires."""
    if dtype != "float32":
        return []
    import torch  # here: the worker's modules load without it until a backend needs it

    problems: list[str] = []
    try:
        precision = torch.get_float32_matmul_precision()
    except RuntimeError:
        # Legacy and per-backend settings were mixed: PyTorch will not summarise them, and the
        # per-backend knobs below say what each backend does.
        precision = "highest"
    if precision != "highest":
        problems.append(
            f'torch.get_float32_matmul_precision() is "{precision}": float32 matmuls may run '
            "with TF32 or bfloat16 inputs (oneDNN on a CPU, cuBLAS on a GPU); call "
            'torch.set_float32_matmul_precision("highest")'
        )
    for path in ("fp32_precision", "mkldnn.fp32_precision", "mkldnn.matmul.fp32_precision"):
        value = _knob(path)
        if isinstance(value, str) and value not in _IEEE:
            problems.append(
                f'torch.backends.{path} is "{value}": float32 GEMMs under it run with {value} '
                f'inputs; set it to "ieee"'
            )
    cuda = device.startswith("cuda")
    cuda_matmul = _knob("cuda.matmul.fp32_precision")
    if isinstance(cuda_matmul, str) and cuda_matmul not in _IEEE:
        problems.append(
            f'torch.backends.cuda.matmul.fp32_precision is "{cuda_matmul}": cuBLAS float32 '
            'matmuls run in TF32; set it to "ieee"'
        )
    elif torch.backends.cuda.matmul.allow_tf32:
        problems.append(
            "torch.backends.cuda.matmul.allow_tf32 is True (or TORCH_ALLOW_TF32_CUBLAS_OVERRIDE "
            "is set): cuBLAS float32 matmuls run in TF32; set it to False"
        )
    if cuda and torch.backends.cudnn.allow_tf32:
        problems.append(
            "torch.backends.cudnn.allow_tf32 is True (PyTorch's default): cuDNN float32 "
            "kernels may run in TF32; set it to False"
        )
    return problems


def refuse_message(dtype: DType, problems: list[str]) -> str:
    """One line saying why a ``dtype`` network's work cannot be done in this process."""
    return (
        f"this process computes below IEEE {dtype}, which a {dtype} network rejects "
        f"(docs/verification.md, What each network dtype admits): {'; '.join(problems)}"
    )

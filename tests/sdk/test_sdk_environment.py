"""The SDK reads no environment variables (docs/worker.md, rollnet.sdk.node): no module of it
names ``os.environ`` or ``os.getenv``; the one switch that was an environment variable (the
compiled field kernel) is a function."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

import rollnet.sdk
from rollnet.sdk.proofs import _field, use_compiled_kernel

SDK = Path(rollnet.sdk.__file__).parent


def test_no_sdk_module_reads_the_environment() -> None:
    readers = []
    for path in sorted(SDK.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Name):
                name = node.id
            else:
                continue
            if name in ("environ", "getenv", "environb", "putenv"):
                readers.append(f"{path.relative_to(SDK)}:{node.lineno} {name}")
    assert readers == []


def test_the_field_kernel_is_switched_by_a_function() -> None:
    built = _field.KERNEL is not None
    x = np.array([[1, 2, 3]], dtype=np.int64)
    y = np.array([[4, 5, 7]], dtype=np.int64)
    try:
        assert use_compiled_kernel(False) is False
        assert _field.KERNEL is None
        numpy_result = _field.interpolate(x, y)
        assert use_compiled_kernel(True) is built
        assert np.array_equal(_field.interpolate(x, y), numpy_result)
    finally:
        use_compiled_kernel(True)

"""The compute dtype a network prescribes, by name and by wire value.

A network computes in one dtype: workers generate in it and validators prefill in it, with that
dtype's calibrated proof thresholds (``rollnet.sdk.proofs.thresholds_for``). The coordinator says
which in ``RegisterNodeResponse.compute_dtype`` and in every ``Task.compute_dtype``; nodes name
the dtypes they can run in ``Capabilities.dtypes`` with the names below. ``UNSPECIFIED`` on the
wire (a message from before the field existed) means float32.
"""

from __future__ import annotations

from typing import Final

from rollnet.v1 import common_pb2

FLOAT32: Final = "float32"
"""IEEE 754 binary32."""
BFLOAT16: Final = "bfloat16"
"""bfloat16."""

_BY_NAME: Final[dict[str, common_pb2.ComputeDtype.ValueType]] = {
    FLOAT32: common_pb2.COMPUTE_DTYPE_FLOAT32,
    BFLOAT16: common_pb2.COMPUTE_DTYPE_BFLOAT16,
}
_BY_VALUE: Final = {value: name for name, value in _BY_NAME.items()}

COMPUTE_DTYPES: Final = tuple(_BY_NAME)
"""The dtype names a network may prescribe, in wire order."""


def compute_dtype_name(value: int) -> str:
    """The name of a ``ComputeDtype`` wire value (``UNSPECIFIED`` is float32).

    Raises ``ValueError`` for a value this SDK does not know (a newer protocol's dtype): a node
    cannot compute in a dtype it has never heard of.
    """
    if value == common_pb2.COMPUTE_DTYPE_UNSPECIFIED:
        return FLOAT32
    try:
        return _BY_VALUE[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown compute dtype {value}") from None


def compute_dtype_value(name: str) -> common_pb2.ComputeDtype.ValueType:
    """The ``ComputeDtype`` wire value of a dtype name (``float32`` or ``bfloat16``)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown compute dtype {name!r}; one of {', '.join(COMPUTE_DTYPES)}"
        ) from None


__all__ = ["BFLOAT16", "COMPUTE_DTYPES", "FLOAT32", "compute_dtype_name", "compute_dtype_value"]

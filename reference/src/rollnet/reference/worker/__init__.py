"""The reference inference worker: checkpoint sync, a pluggable inference backend, rewards.

:class:`InferenceGenerator` is the :class:`rollnet.sdk.worker.RolloutGenerator` behind
``rollnet worker``; the SDK's :class:`~rollnet.sdk.worker.Worker` does everything else.
"""

from rollnet.reference.worker.generator import BACKENDS, InferenceGenerator, make_backend
from rollnet.sdk.prompts import encode_problem, encode_prompt

__all__ = ["BACKENDS", "InferenceGenerator", "encode_problem", "encode_prompt", "make_backend"]

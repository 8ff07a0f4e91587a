"""Checkpoints for validation: fetched once per step, verified against the signed manifest,
loaded into an inference backend and kept while recent jobs still need them."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from pathlib import Path

from rollnet.reference.inference.base import DType
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.logs import get_logger
from rollnet.reference.validator.pipeline import CheckpointModel
from rollnet.sdk.checkpoints import BlobServiceShards, CheckpointStore
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.proofs import thresholds_for
from rollnet.v1 import checkpoint_service_pb2

log = get_logger("rollnet.validator.checkpoints")

_LOAD_LOCK = threading.Lock()


class CheckpointModels:
    """Loaded checkpoints by step and dtype (the newest ``keep`` stay in memory).

    Files come through :class:`rollnet.sdk.checkpoints.CheckpointStore`, which checks the
    trainer's signature, the network id and every shard and file digest before a directory is
    used, and resumes interrupted downloads. Loading happens on a thread. A checkpoint is loaded
    in the dtype the job's task prescribes, with that dtype's calibrated thresholds.
    """

    def __init__(self, store: CheckpointStore, *, device: str = "cpu", keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.store = store
        self.device = device
        self.keep = keep
        self._loaded: OrderedDict[tuple[int, DType], CheckpointModel] = OrderedDict()
        self._locks: dict[tuple[int, DType], asyncio.Lock] = {}

    async def get(self, step: int, dtype: DType, client: RollnetClient) -> CheckpointModel:
        """The model of checkpoint ``step`` in ``dtype``: fetched, verified and loaded if not yet
        in memory."""
        key = (step, dtype)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            model = self._loaded.get(key)
            if model is not None:
                self._loaded.move_to_end(key)
                return model
            directory = self.store.path(step)
            if directory is None:
                response = await client.checkpoints.get_checkpoint(
                    checkpoint_service_pb2.GetCheckpointRequest(step=step)
                )
                directory = await self.store.ensure(response.checkpoint, BlobServiceShards(client))
            model = await asyncio.to_thread(self._load, step, dtype, directory)
            self._loaded[key] = model
            while len(self._loaded) > self.keep:
                (evicted, evicted_dtype), _ = self._loaded.popitem(last=False)
                log.info("checkpoint_evicted", step=evicted, dtype=evicted_dtype)
            return model

    def _load(self, step: int, dtype: DType, directory: Path) -> CheckpointModel:
        from rollnet.reference.inference.torch_backend import TorchBackend

        # transformers' loading is not thread-safe (its meta-device init is process-wide).
        with _LOAD_LOCK:
            backend = TorchBackend()
            backend.load(str(directory), device=self.device, dtype=dtype)
            tokenizer = CheckpointTokenizer.load(directory)
        log.info("checkpoint_loaded", step=step, dtype=dtype)
        return CheckpointModel(
            step=step, backend=backend, tokenizer=tokenizer, thresholds=thresholds_for(dtype)
        )


__all__ = ["CheckpointModels"]

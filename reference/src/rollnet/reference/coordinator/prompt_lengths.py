"""The token count of every prompt the coordinator assigns, recorded when it assigns it.

Credit for work nobody validated is what the coordinator counts in the batch, so that count
must be bounded by what the coordinator knows without a model. Completions are bounded by the
task's ``max_new_tokens``; prompts by this module: when a demand is turned into tasks, each
assigned prompt is rendered by its environment and encoded with the task's checkpoint tokenizer
(``tokenizer.json``, with its chat template: the one rule of docs/protocol.md, *Tokenization*,
that worker and validator follow), and its length is recorded with the task. A rollout whose
prompt is not exactly that long is refused at submission. The tokenizer files are read from the
blob store, where the trainer's checkpoint shards are, checked against the manifest's digests.

A prompt whose length cannot be known (a checkpoint without ``tokenizer.json``, a prompt the
tokenizer or the environment fails on) is recorded as unknown: work for such a task is never
credited without a validator (its spot check is not skipped).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import blake3

from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.envs import Environment
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.sdk.prompts import encode_problem
from rollnet.v1 import checkpoint_pb2

log = logging.getLogger("rollnet.coordinator")

#: The checkpoint files tokenization reads (docs/protocol.md, *Tokenization*).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
#: Checkpoints whose tokenizer is kept loaded (tasks are made against the latest one).
_KEPT = 2


class PromptLengths:
    """Loads checkpoint tokenizers from the blob store (kept for the latest few steps) and
    counts the tokens of assigned prompts."""

    def __init__(self, blobs: BlobStore, work_dir: Path) -> None:
        self.blobs = blobs
        self.work_dir = work_dir
        self._tokenizers: OrderedDict[str, CheckpointTokenizer | None] = OrderedDict()
        # Demands are split on worker threads, several at once.
        self._lock = threading.Lock()

    def tokenizer(self, manifest_bytes: bytes) -> CheckpointTokenizer | None:
        """The tokenizer of the checkpoint whose manifest is ``manifest_bytes``; ``None`` when
        it has no ``tokenizer.json`` or its files cannot be read. Blocking: call off the loop."""
        key = blake3.blake3(manifest_bytes).hexdigest()
        with self._lock:
            return self._tokenizer(key, manifest_bytes)

    def _tokenizer(self, key: str, manifest_bytes: bytes) -> CheckpointTokenizer | None:
        if key in self._tokenizers:
            self._tokenizers.move_to_end(key)
            return self._tokenizers[key]
        manifest = checkpoint_pb2.CheckpointManifest.FromString(manifest_bytes)
        try:
            loaded = self._load(manifest, key)
        except Exception as error:  # a missing or broken file: lengths unknown
            log.warning(
                "checkpoint %d: its tokenizer cannot be loaded (%s); work on its tasks is "
                "credited only once validated",
                manifest.step,
                error,
            )
            loaded = None
        self._tokenizers[key] = loaded
        while len(self._tokenizers) > _KEPT:
            self._tokenizers.popitem(last=False)
        return loaded

    def _load(
        self, manifest: checkpoint_pb2.CheckpointManifest, key: str
    ) -> CheckpointTokenizer | None:
        files = {item.path: item for item in manifest.files if item.path in TOKENIZER_FILES}
        if TOKENIZER_FILES[0] not in files:
            return None
        directory = self.work_dir / key
        if not (directory / TOKENIZER_FILES[0]).is_file():
            self.work_dir.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.work_dir, prefix=".partial-"))
            for path, item in files.items():
                data = b"".join(self.blobs.read_range(s.blake3, 0, 0)[1] for s in item.shards)
                if blake3.blake3(data).digest() != item.content.blake3:
                    raise ValueError(f"{path}: its shards do not hash to the manifest's digest")
                (staging / path).write_bytes(data)
            try:
                os.rename(staging, directory)
            except OSError:  # another call put it there first: the same files
                for child in staging.iterdir():
                    child.unlink()
                staging.rmdir()
        return CheckpointTokenizer.load(directory)

    @staticmethod
    def count(
        environment: Environment, tokenizer: CheckpointTokenizer, prompt_ids: Sequence[int]
    ) -> list[int] | None:
        """The token count of each prompt, as a worker encodes it; ``None`` when any of them
        cannot be encoded (its environment or the tokenizer fails on it)."""
        try:
            return [len(encode_problem(tokenizer, environment.prompt(int(p)))) for p in prompt_ids]
        except Exception as error:  # an environment's or template's own failure
            log.warning("prompt lengths unknown (%s): the tasks' work is validated", error)
            return None

"""A rollnet worker written from the protocol documents alone: the proof that they suffice.

It uses the generated messages and stubs (``rollnet.v1``), ``grpcio``, Google's ``google.rpc``
error messages, ``cryptography`` (Ed25519), ``blake3``, ``numpy`` and ``torch`` (the model), and
``tokenizers`` (which *defines* tokenization, docs/protocol.md) — and nothing from
``rollnet.sdk`` or ``rollnet.reference``. Every rule it follows is cited from ``docs/``:

* request signing — protocol.md, *Request signing*;
* the checkpoint, its signature and file paths — protocol.md, *Other signed bytes*, *Rollouts*;
* the model — a Qwen2 decoder (the tiny model's ``config.json``) in plain torch, float32;
* prompts and rewards — environments.md, *Draw streams*, *Built-in: arithmetic*,
  *The determinism contract*;
* sampling, TOPLOC, binding — verification.md, *Exact sampling check*, *TOPLOC commitments*,
  *Binding: byte layout*; end of sequence — protocol.md, *End of sequence*;
* the worker's life, retries, drain — protocol.md, *Message flows*, *Retrying*, *Node*.

It serves the ``arithmetic`` environment in float32 and leases one task at a time. Run::

    python examples/minimal_worker.py --coordinator HOST:PORT --key worker.key \\
        --data-dir DIR --network-id ID

``rollnet conformance worker --command "{python} examples/minimal_worker.py --coordinator
{target} --key {key} --data-dir {data_dir} --network-id {network_id}"`` checks it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import signal
import struct
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3
import grpc
import numpy as np
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from tokenizers import Tokenizer

from rollnet.v1 import (
    blob_service_pb2,
    blob_service_pb2_grpc,
    checkpoint_pb2,
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    commitment_pb2,
    commitment_service_pb2,
    commitment_service_pb2_grpc,
    common_pb2,
    node_pb2,
    node_service_pb2,
    node_service_pb2_grpc,
    rollout_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
)

# ============================================================================ identity, signing


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Key:
    """An Ed25519 node key from an unencrypted PKCS#8 PEM file (protocol.md, *Keys*)."""

    def __init__(self, path: Path) -> None:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(loaded, Ed25519PrivateKey)
        self.private = loaded
        self.public = loaded.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.node_id = blake3.blake3(b"rollnet-node-id-v1" + self.public).digest()[:16].hex()

    def headers(self, audience: str, method: str, body: bytes) -> tuple[tuple[str, str], ...]:
        """The six signing headers of one call; a fresh nonce and time every attempt."""
        timestamp = str(int(time.time() * 1000))
        nonce = os.urandom(16).hex()
        digest = blake3.blake3(body).hexdigest()
        signed = "\n".join(("rollnet-request-v1", audience, method, timestamp, nonce, digest))
        return (
            ("x-rollnet-key", b64url(self.public)),
            ("x-rollnet-audience", audience),
            ("x-rollnet-timestamp", timestamp),
            ("x-rollnet-nonce", nonce),
            ("x-rollnet-body-blake3", digest),
            ("x-rollnet-signature", b64url(self.private.sign(signed.encode()))),
        )


class Refused(Exception):
    """A call failed: its code, ErrorInfo reason and RetryInfo delay (protocol.md, *Errors*)."""

    def __init__(self, error: grpc.aio.AioRpcError) -> None:
        self.code = error.code()
        self.reason = ""
        self.retry_after: float | None = None
        for key, value in error.trailing_metadata() or ():
            if key != "grpc-status-details-bin":
                continue
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    self.reason = info.reason
                elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    detail.Unpack(retry)
                    self.retry_after = retry.retry_delay.ToNanoseconds() / 1e9
        super().__init__(f"{self.code.name}/{self.reason}: {error.details()}")

    @property
    def retryable(self) -> bool:
        """protocol.md, *Retrying*: UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED (every v1 RPC is
        idempotent) and RESOURCE_EXHAUSTED with a RetryInfo."""
        codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)
        if self.code in codes or self.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return True
        return self.code is grpc.StatusCode.RESOURCE_EXHAUSTED and self.retry_after is not None


class Coordinator:
    """Signed calls through the generated stubs, retried with back-off as *Retrying* says."""

    def __init__(self, target: str, network_id: str, key: Key) -> None:
        self.network_id = network_id
        self.key = key
        self.channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.enable_retries", 0),  # each attempt is signed afresh, by us
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self.nodes = node_service_pb2_grpc.NodeServiceStub(self.channel)
        self.tasks = task_service_pb2_grpc.TaskServiceStub(self.channel)
        self.blobs = blob_service_pb2_grpc.BlobServiceStub(self.channel)
        self.commitments = commitment_service_pb2_grpc.CommitmentServiceStub(self.channel)
        self.checkpoints = checkpoint_service_pb2_grpc.CheckpointServiceStub(self.channel)

    async def call(
        self,
        service: str,
        rpc: str,
        request: Any,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 (a gRPC deadline per attempt)
        attempts: int = 30,
    ) -> Any:
        method = f"/rollnet.v1.{service}/{rpc}"
        stub = {
            "NodeService": self.nodes,
            "TaskService": self.tasks,
            "CommitmentService": self.commitments,
            "CheckpointService": self.checkpoints,
        }[service]
        body = request.SerializeToString()
        wait = 0.1
        for attempt in range(attempts):
            try:
                return await getattr(stub, rpc)(
                    request,
                    metadata=self.key.headers(self.network_id, method, body),
                    timeout=timeout,
                )
            except grpc.aio.AioRpcError as error:
                refused = Refused(error)
                if not refused.retryable or attempt == attempts - 1:
                    raise refused from None
                delay = max(wait * random.uniform(0.8, 1.2), refused.retry_after or 0.0)
                await asyncio.sleep(delay)
                wait = min(wait * 2, 2.0)
        raise AssertionError("unreachable")

    async def upload(self, data: bytes) -> common_pb2.BlobRef:
        """UploadBlob: a header (signed) naming BLAKE3 and size, then 1 MiB chunks."""
        ref = common_pb2.BlobRef(blake3=blake3.blake3(data).digest(), size=len(data))
        header = blob_service_pb2.UploadBlobRequest(
            header=blob_service_pb2.BlobHeader(
                blob=ref, kind=blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH
            )
        )
        method = "/rollnet.v1.BlobService/UploadBlob"
        for attempt in range(30):
            messages = [header] + [
                blob_service_pb2.UploadBlobRequest(chunk=data[i : i + (1 << 20)])
                for i in range(0, len(data), 1 << 20)
            ]
            try:
                await self.blobs.UploadBlob(
                    iter(messages),
                    metadata=self.key.headers(self.network_id, method, header.SerializeToString()),
                    timeout=60.0,
                )
                return ref
            except grpc.aio.AioRpcError as error:
                refused = Refused(error)
                if not refused.retryable or attempt == 29:
                    raise refused from None
                await asyncio.sleep(max(0.2, refused.retry_after or 0.0))
        raise AssertionError("unreachable")

    async def download(self, ref: common_pb2.BlobRef) -> bytes:
        """GetBlob, checked against its BLAKE3 and size."""
        method = "/rollnet.v1.BlobService/GetBlob"
        request = blob_service_pb2.GetBlobRequest(blake3=ref.blake3)
        for attempt in range(30):
            parts = []
            try:
                async for part in self.blobs.GetBlob(
                    request,
                    metadata=self.key.headers(self.network_id, method, request.SerializeToString()),
                    timeout=120.0,
                ):
                    parts.append(part.chunk)
            except grpc.aio.AioRpcError as error:
                refused = Refused(error)
                if not refused.retryable or attempt == 29:
                    raise refused from None
                await asyncio.sleep(max(0.2, refused.retry_after or 0.0))
                continue
            data = b"".join(parts)
            if len(data) != ref.size or blake3.blake3(data).digest() != ref.blake3:
                raise ValueError("a downloaded blob does not match its BLAKE3 and size")
            return data
        raise AssertionError("unreachable")


# ============================================================================ binding digests


def encode_field(value: str | bytes | int) -> bytes:
    """verification.md, *Binding: byte layout*."""
    if isinstance(value, str):
        data = value.encode()
        return b"\x01" + struct.pack(">I", len(data)) + data
    if isinstance(value, bytes):
        return b"\x02" + struct.pack(">I", len(value)) + value
    return b"\x03" + struct.pack(">q", value)


def domain_digest(domain: str, *fields: str | bytes | int) -> bytes:
    hasher = blake3.blake3(encode_field(domain))
    for field in fields:
        hasher.update(encode_field(field))
    digest: bytes = hasher.digest()
    return digest


def sampling_seed(network: str, task: str, index: int) -> int:
    """verification.md, *Binding*: the seed depends on the task, never on who leases it."""
    digest = domain_digest("rollnet/v1/task-sampling-seed", network, task, index)
    return int.from_bytes(digest[:8], "big") >> 1


# ============================================================================ sampling


M32 = 0xFFFFFFFF


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def gumbel(seed: int, position: int, vocab: int) -> np.ndarray:
    """verification.md, *Exact sampling check*: the noise of every token at one position."""
    head = np.array([(seed & M32) ^ 0x243F6A88], dtype=np.uint64)
    head = _mix(_mix(head) ^ np.uint64(seed >> 32))
    row = _mix(head ^ np.uint64(position))
    h = _mix(row ^ np.arange(vocab, dtype=np.uint64))
    u = ((h >> 8).astype(np.float64) + 0.5) / float(1 << 24)
    noise: np.ndarray = -np.log(-np.log(u))
    return noise


# ============================================================================ TOPLOC


PRIME = 65497
WINDOW = 32
TOPK = 128


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest, ties to even."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _magnitude(bits: int) -> float:
    value: float = struct.unpack(">f", struct.pack(">I", bits << 16))[0]
    return abs(value)


def _poly_mul_linear(poly: list[int], root: int) -> list[int]:
    """poly × (x − root) over GF(PRIME), coefficients ascending."""
    out = [0] * (len(poly) + 1)
    for i, c in enumerate(poly):
        out[i + 1] = (out[i + 1] + c) % PRIME
        out[i] = (out[i] - c * root) % PRIME
    return out


def interpolate(xs: Sequence[int], ys: Sequence[int]) -> list[int]:
    """The polynomial of degree < len(xs) through the points, coefficients ascending."""
    vanishing = [1]
    for x in xs:
        vanishing = _poly_mul_linear(vanishing, x)
    result = [0] * len(xs)
    for xj, yj in zip(xs, ys, strict=True):
        # vanishing / (x − xj) by synthetic division, then scale by yj / Π(xj − xm).
        quotient = [0] * len(xs)
        carry = 0
        for i in range(len(vanishing) - 1, 0, -1):
            carry = (vanishing[i] + carry * xj) % PRIME
            quotient[i - 1] = carry
        denominator = 0
        for c in reversed(quotient):
            denominator = (denominator * xj + c) % PRIME
        scale = yj * pow(denominator, PRIME - 2, PRIME) % PRIME
        for i, c in enumerate(quotient):
            result[i] = (result[i] + c * scale) % PRIME
    return result


def window_proof(hidden: np.ndarray) -> bytes:
    """verification.md, *TOPLOC commitments*: one window's 258 bytes."""
    flat = bf16_bits(hidden).reshape(-1)
    order = sorted(range(len(flat)), key=lambda i: (-_magnitude(int(flat[i])), i))
    chosen = order[: min(TOPK, len(flat))]
    modulus = PRIME
    while len({i % modulus for i in chosen}) != len(chosen):
        modulus -= 1
        if modulus < 1 << 15:
            raise ValueError("no injective modulus")
    coefficients = interpolate([i % modulus for i in chosen], [int(flat[i]) for i in chosen])
    coefficients += [0] * (TOPK - len(coefficients))
    return struct.pack(">H", modulus) + b"".join(struct.pack(">H", c) for c in coefficients)


def toploc_proof(hidden: np.ndarray) -> bytes:
    """The rollout's proof: one window per 32 rows of final-norm hidden states."""
    return b"".join(window_proof(hidden[i : i + WINDOW]) for i in range(0, len(hidden), WINDOW))


# ============================================================================ the model


class Qwen2:
    """The decoder of the checkpoint's config.json, float32, from its safetensors file."""

    def __init__(self, folder: Path) -> None:
        self.config = json.loads((folder / "config.json").read_text())
        self.weights: dict[str, torch.Tensor] = {}
        for path in sorted(folder.glob("*.safetensors")):
            self.weights.update(read_safetensors(path))
        c = self.config
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c["rms_norm_eps"]
        rope = c.get("rope_parameters") or {}
        self.theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        embed = self.weights["model.embed_tokens.weight"]
        self.lm_head = self.weights.get("lm_head.weight", embed)

    def norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weights[weight] * (x * torch.rsqrt(variance + self.eps))

    def rotary(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (
            self.theta
            ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim)
        )
        freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    @torch.no_grad()
    def forward(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-norm hidden states [n, d], logits [n, V]) of every position."""
        w = self.weights
        x = w["model.embed_tokens.weight"][torch.tensor(list(ids))]
        n = x.shape[0]
        cos, sin = self.rotary(n)
        mask = torch.full((n, n), float("-inf")).triu(1)
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            h = self.norm(x, p + "input_layernorm.weight")
            q = torch.nn.functional.linear(
                h, w[p + "self_attn.q_proj.weight"], w.get(p + "self_attn.q_proj.bias")
            )
            k = torch.nn.functional.linear(
                h, w[p + "self_attn.k_proj.weight"], w.get(p + "self_attn.k_proj.bias")
            )
            v = torch.nn.functional.linear(
                h, w[p + "self_attn.v_proj.weight"], w.get(p + "self_attn.v_proj.bias")
            )
            q = q.view(n, self.heads, self.head_dim).transpose(0, 1)
            k = k.view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            v = v.view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            groups = self.heads // self.kv_heads
            k = k.repeat_interleave(groups, dim=0)
            v = v.repeat_interleave(groups, dim=0)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
            attn = torch.softmax(scores, dim=-1) @ v
            attn = attn.transpose(0, 1).reshape(n, self.heads * self.head_dim)
            x = x + torch.nn.functional.linear(attn, w[p + "self_attn.o_proj.weight"])
            h = self.norm(x, p + "post_attention_layernorm.weight")
            gate = torch.nn.functional.linear(h, w[p + "mlp.gate_proj.weight"])
            up = torch.nn.functional.linear(h, w[p + "mlp.up_proj.weight"])
            x = x + torch.nn.functional.linear(
                torch.nn.functional.silu(gate) * up, w[p + "mlp.down_proj.weight"]
            )
        hidden = self.norm(x, "model.norm.weight")
        return hidden, torch.nn.functional.linear(hidden, self.lm_head)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The safetensors format: u64 LE header length, a JSON header, then the raw tensors."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    base = 8 + length
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        array = np.frombuffer(data[base + start : base + end], dtype=dtypes[info["dtype"]])
        tensors[name] = torch.from_numpy(array.reshape(info["shape"]).astype(np.float32).copy())
    return tensors


def eos_ids(folder: Path) -> set[int]:
    """protocol.md, *End of sequence*: the union of both files' top-level eos_token_id."""
    found: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if not path.exists():
            continue
        value = json.loads(path.read_text()).get("eos_token_id")
        if value is None:
            continue
        found.update(value if isinstance(value, list) else [value])
    return found


# ============================================================================ arithmetic


LEVELS = {
    1: (1, 1, "+", False),
    2: (1, 1, "+-", False),
    3: (1, 2, "+-", False),
    4: (2, 2, "+-", True),
    5: (1, 2, "+-*", True),
    6: (2, 3, "+-*", True),
}


class Draws:
    """environments.md, *Draw streams*."""

    def __init__(self, name: str, seed: int, prompt_id: int, label: str) -> None:
        material = (
            b"rollnet.environment-draw.v1\x00"
            + struct.pack("<I", len(name.encode()))
            + name.encode()
            + struct.pack("<Q", seed)
            + struct.pack("<Q", prompt_id)
            + struct.pack("<I", len(label.encode()))
            + label.encode()
        )
        self.hasher = blake3.blake3(material)
        self.position = 0

    def word(self) -> int:
        data = self.hasher.digest(length=8, seek=self.position)
        self.position += 8
        return int.from_bytes(data, "little")

    def below(self, n: int) -> int:
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            word = self.word()
            if word < limit:
                return word % n

    def between(self, low: int, high: int) -> int:
        return low + self.below(high - low + 1)

    def choice(self, items: Sequence[Any]) -> Any:
        return items[self.below(len(items))]


def arithmetic_problem(config: dict[str, Any], prompt_id: int) -> tuple[str, str, int]:
    """(prompt, answer, target length) of one prompt id (environments.md, *arithmetic*)."""
    level = int(config.get("level", 1))
    low, high, ops, negative = LEVELS[level]
    low = int(config.get("min_digits", low))
    high = int(config.get("max_digits", high))
    ops = str(config.get("operators", ops))
    negative = bool(config.get("allow_negative", negative))
    seed = int(config.get("seed", 0))
    draws = Draws("arithmetic", seed, prompt_id, "problem")
    op = draws.choice(ops)
    values = []
    for _ in range(2):
        digits = draws.between(low, high)
        values.append(draws.between(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1))
    a, b = values
    if op == "-" and not negative and a < b:
        a, b = b, a
    result = a + b if op == "+" else a - b if op == "-" else a * b
    prompt = f"{a}{op}{b}="
    targets = [int(t) for t in config.get("target_lengths", [])]
    target = 0
    if targets:
        target = Draws("arithmetic", seed, prompt_id, "target_length").choice(targets)
        template = str(config.get("length_template", "Think for {target} tokens. {prompt}"))
        prompt = _fill(template, prompt, target)
    return prompt, str(result), target


def _fill(template: str, prompt: str, target: int) -> str:
    """Substitute {prompt} and {target} in one pass, no other braces interpreted."""
    out, i = [], 0
    while i < len(template):
        if template.startswith("{prompt}", i):
            out.append(prompt)
            i += len("{prompt}")
        elif template.startswith("{target}", i):
            out.append(str(target))
            i += len("{target}")
        else:
            out.append(template[i])
            i += 1
    return "".join(out)


def arithmetic_reward(
    config: dict[str, Any], answer: str, target: int, text: str, tokens: int
) -> common_pb2.Reward:
    """The strict answer rule, then the length penalty (*The determinism contract*, rule 4)."""
    task_reward = 1.0 if text.split("\n", 1)[0] == answer else 0.0
    if not target:
        return common_pb2.Reward(task_reward=task_reward, length_penalty=0.0, total=task_reward)
    penalty = float(config.get("length_penalty", 0.0003)) * abs(tokens - target)
    return common_pb2.Reward(
        task_reward=task_reward, length_penalty=penalty, total=task_reward - penalty
    )


# ============================================================================ the worker


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.key = Key(args.key)
        self.data_dir = Path(args.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.coordinator = Coordinator(args.coordinator, args.network_id, self.key)
        self.network_id = args.network_id
        self.interval = 10.0
        self.held: set[str] = set()
        self.stopping = asyncio.Event()
        self.models: dict[int, tuple[Qwen2, Tokenizer, set[int]]] = {}

    async def register(self) -> None:
        response = await self.coordinator.call(
            "NodeService",
            "RegisterNode",
            node_service_pb2.RegisterNodeRequest(
                request_id=uuid.uuid4().hex,
                public_key=self.key.public,
                role=common_pb2.ROLE_WORKER,
                protocol_version=common_pb2.ProtocolVersion(major=1, minor=0),
                software_version="minimal-worker/0.1",
                capabilities=node_pb2.Capabilities(
                    backends=["torch"],
                    environments=["arithmetic"],
                    dtypes=["float32"],
                    max_concurrent_leases=1,
                ),
                hardware=node_pb2.HardwareReport(cpu_cores=os.cpu_count() or 1),
            ),
        )
        self.interval = response.heartbeat_interval.ToTimedelta().total_seconds() or 10.0
        print(f"registered {self.key.node_id}", flush=True)

    async def heartbeats(self) -> None:
        while not self.stopping.is_set():
            try:
                beat = await self.coordinator.call(
                    "NodeService",
                    "Heartbeat",
                    node_service_pb2.HeartbeatRequest(
                        activity=node_service_pb2.ACTIVITY_BUSY
                        if self.held
                        else node_service_pb2.ACTIVITY_IDLE,
                        held_lease_ids=sorted(self.held),
                    ),
                    attempts=3,
                )
            except Refused as refused:
                print(f"heartbeat refused: {refused}", flush=True)
                if refused.reason == "NODE_BANNED":
                    self.stopping.set()
                    return
            else:
                granted = beat.heartbeat_interval.ToTimedelta().total_seconds()
                self.interval = granted or self.interval
                for command in beat.commands:
                    kind = command.WhichOneof("command")
                    if kind == "drain":
                        print(f"drain: {command.drain.reason}", flush=True)
                        self.stopping.set()
                    elif kind == "reregister":
                        await self.register()
            await asyncio.sleep(self.interval * random.uniform(0.9, 1.1))

    async def run(self) -> int:
        await self.register()
        beats = asyncio.create_task(self.heartbeats())
        try:
            while not self.stopping.is_set():
                await self.pull_once()
        finally:
            beats.cancel()
        try:
            await self.coordinator.call(
                "NodeService",
                "DeregisterNode",
                node_service_pb2.DeregisterNodeRequest(
                    request_id=uuid.uuid4().hex, reason="draining"
                ),
                attempts=3,
            )
        except Refused as refused:
            print(f"deregister refused: {refused}", flush=True)
        return 0

    async def pull_once(self) -> None:
        request = task_service_pb2.PullTaskRequest(
            request_id=uuid.uuid4().hex,
            wait=duration_pb2.Duration(seconds=1),
            environments=["arithmetic"],
        )
        try:
            pulled = await self.coordinator.call("TaskService", "PullTask", request)
        except Refused as refused:
            print(f"pull refused: {refused}", flush=True)
            if refused.code in (grpc.StatusCode.PERMISSION_DENIED,):
                self.stopping.set()
            elif refused.reason == "NODE_DEREGISTERED":
                await self.register()
            else:
                await asyncio.sleep(refused.retry_after or 1.0)
            return
        if not pulled.HasField("task"):
            delay = pulled.retry_after.ToTimedelta().total_seconds()
            if delay:
                await asyncio.wait([asyncio.ensure_future(self.stopping.wait())], timeout=delay)
            return
        lease = pulled.lease
        self.held.add(lease.lease_id)
        try:
            if self.stopping.is_set():
                await self.give_back(lease, task_service_pb2.FAIL_REASON_DRAINING)
                return
            await self.work(pulled.task, lease)
        except Refused as refused:
            print(f"task {pulled.task.task_id} refused: {refused}", flush=True)
        finally:
            self.held.discard(lease.lease_id)

    async def give_back(self, lease: Any, reason: int) -> None:
        await self.coordinator.call(
            "TaskService",
            "FailTask",
            task_service_pb2.FailTaskRequest(
                request_id=uuid.uuid4().hex,
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                reason=reason,  # type: ignore[arg-type]
            ),
        )

    def rollout_commitment(
        self, task: Any, lease: Any, blob: common_pb2.BlobRef, index: int, rollout: Any
    ) -> bytes:
        """verification.md, *Binding: byte layout*: the rollout's commitment digest."""
        tokens = domain_digest(
            "rollnet/v1/rollout-tokens",
            _u32le(rollout.prompt_token_ids),
            _u32le(rollout.completion_token_ids),
        )
        return domain_digest(
            "rollnet/v1/rollout-commitment",
            self.network_id,
            self.key.node_id,
            task.task_id,
            lease.lease_id,
            lease.fencing_token,
            blob.blake3,
            index,
            rollout.sampling_seed,
            tokens,
            domain_digest("rollnet/v1/toploc-proof", rollout.toploc_proof),
        )

    async def checkpoint(self, step: int) -> tuple[Qwen2, Tokenizer, set[int]]:
        """GetCheckpoint(step): the trainer's signature, the network, the paths, then every
        shard and file against its BLAKE3 (protocol.md, *Rollouts*, step 1)."""
        if step in self.models:
            return self.models[step]
        got = await self.coordinator.call(
            "CheckpointService",
            "GetCheckpoint",
            checkpoint_service_pb2.GetCheckpointRequest(step=step),
        )
        checkpoint = got.checkpoint
        Ed25519PublicKey.from_public_bytes(checkpoint.trainer_public_key).verify(
            checkpoint.signature, b"rollnet-checkpoint-v1\n" + checkpoint.manifest
        )
        manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
        if manifest.network_id != self.network_id or manifest.step != step:
            raise ValueError("the manifest is for another network or step")
        folder = self.data_dir / f"step-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        for file in manifest.files:
            parts = [p for p in file.path.split("/") if p]
            if not parts or any(p.startswith(".") or p.endswith(".") for p in parts):
                raise ValueError(f"unsafe checkpoint path {file.path!r}")
            shards = file.shards or [file.content]
            content = b"".join([await self.coordinator.download(ref) for ref in shards])
            if blake3.blake3(content).digest() != file.content.blake3:
                raise ValueError(f"{file.path} does not match its BLAKE3")
            target = folder.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        loaded = (
            Qwen2(folder),
            Tokenizer.from_file(str(folder / "tokenizer.json")),
            eos_ids(folder),
        )
        self.models[step] = loaded
        return loaded

    async def work(self, task: Any, lease: Any) -> None:
        if task.environment != "arithmetic" or task.compute_dtype not in (
            common_pb2.COMPUTE_DTYPE_UNSPECIFIED,
            common_pb2.COMPUTE_DTYPE_FLOAT32,
        ):
            await self.give_back(lease, task_service_pb2.FAIL_REASON_BACKEND_ERROR)
            return
        model, tokenizer, eos = await self.checkpoint(task.checkpoint_step)
        config = json.loads(_struct_json(task.environment_config))
        temperature = task.sampling.temperature
        rollouts = []
        for i in range(len(task.prompt_ids) * task.samples_per_prompt):
            prompt_index, sample = divmod(i, task.samples_per_prompt)
            prompt_id = task.prompt_ids[prompt_index]
            prompt, answer, target = arithmetic_problem(config, prompt_id)
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
            seed = sampling_seed(self.network_id, task.task_id, i)
            completion, logprobs, hidden = await asyncio.to_thread(
                generate, model, prompt_ids, seed, temperature, task.sampling.max_new_tokens, eos
            )
            text = tokenizer.decode(completion, skip_special_tokens=True)
            rollouts.append(
                rollout_pb2.Rollout(
                    prompt_index=prompt_index,
                    prompt_id=prompt_id,
                    sample_index=sample,
                    prompt_token_ids=prompt_ids,
                    completion_token_ids=completion,
                    behaviour_logprobs=logprobs,
                    sampling_seed=seed,
                    target_length=target,
                    finish_reason=rollout_pb2.FINISH_REASON_EOS
                    if completion[-1] in eos
                    else rollout_pb2.FINISH_REASON_LENGTH,
                    toploc_proof=toploc_proof(hidden),
                    claimed_reward=arithmetic_reward(config, answer, target, text, len(completion)),
                )
            )
        batch = rollout_pb2.RolloutBatch(
            task_id=task.task_id,
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
            node_id=self.key.node_id,
            checkpoint_step=task.checkpoint_step,
            rollouts=rollouts,
        ).SerializeToString()
        blob = await self.coordinator.upload(batch)
        await self.coordinator.call(
            "CommitmentService",
            "SubmitCommitment",
            commitment_service_pb2.SubmitCommitmentRequest(
                request_id=uuid.uuid4().hex,
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                task_id=task.task_id,
                rollout_batch=blob,
                rollouts=[
                    commitment_pb2.RolloutDigest(
                        sampling_seed=r.sampling_seed,
                        proof_blake3=domain_digest("rollnet/v1/toploc-proof", r.toploc_proof),
                        completion_tokens=len(r.completion_token_ids),
                        commitment_digest=self.rollout_commitment(task, lease, blob, i, r),
                    )
                    for i, r in enumerate(rollouts)
                ],
                claimed_work=commitment_pb2.WorkClaim(
                    prefill_tokens=sum(len(r.prompt_token_ids) for r in rollouts),
                    decode_tokens=sum(len(r.completion_token_ids) for r in rollouts),
                ),
                binding_digest=domain_digest(
                    "rollnet/v1/batch-commitment",
                    self.network_id,
                    self.key.node_id,
                    task.task_id,
                    lease.lease_id,
                    lease.fencing_token,
                    blob.blake3,
                ),
            ),
        )
        print(f"committed task {task.task_id}", flush=True)


def _u32le(ids: Sequence[int]) -> bytes:
    return b"".join(struct.pack("<I", i) for i in ids)


def _struct_json(value: Any) -> str:
    from google.protobuf import json_format

    text: str = json_format.MessageToJson(value)
    return text or "{}"


def generate(
    model: Qwen2,
    prompt_ids: Sequence[int],
    seed: int,
    temperature: float,
    max_new_tokens: int,
    eos: set[int],
) -> tuple[list[int], list[float], np.ndarray]:
    """Seeded Gumbel-max decoding (protocol.md, *Rollouts*, step 4); row t of the hidden states
    is the position that predicted token t (verification.md, *Row alignment*)."""
    ids = list(prompt_ids)
    completion: list[int] = []
    logprobs: list[float] = []
    rows = []
    for t in range(max_new_tokens):
        hidden, logits = model.forward(ids)
        z = logits[-1].double().numpy()
        scores = z / temperature + gumbel(seed, t, len(z))
        token = int(np.argmax(scores))  # the first of equal scores: the lowest id
        scaled = torch.from_numpy(z / temperature)
        logprobs.append(float(torch.log_softmax(scaled, dim=-1)[token]))
        rows.append(hidden[-1].numpy())
        completion.append(token)
        ids.append(token)
        if token in eos:
            break
    return completion, logprobs, np.stack(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--key", required=True, type=Path)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--network-id", default="rollnet-local")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    async def run() -> int:
        worker = Worker(args)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stopping.set)
        loop.add_signal_handler(signal.SIGINT, worker.stopping.set)
        return await worker.run()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())

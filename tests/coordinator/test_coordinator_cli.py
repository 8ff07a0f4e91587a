"""The operator and publisher commands end to end against a real coordinator:
``rollnet nodes list|show|eject|ban`` and ``rollnet checkpoint publish``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import blake3
import grpc
import numpy as np
import pytest
import structlog
from coordinator_testing import (
    COMPLETION_TOKENS,
    judge_next_job,
    pull,
    pull_and_commit,
    register,
    request_tasks,
    running_parties,
)
from safetensors.numpy import save_file

from rollnet.reference.checkpoint_publishing import (
    CheckpointDirError,
    flops_per_token,
    model_files,
    publish_model_dir,
)
from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import Coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetError, verify_signature
from rollnet.sdk.checkpoints import BlobServiceShards, CheckpointStore
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import (
    checkpoint_pb2,
    checkpoint_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
)


async def rollnet(*argv: str) -> int:
    """Run the ``rollnet`` CLI in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(cli_main, list(argv))


@pytest.fixture(autouse=True)
def quiet_coordinator() -> Iterator[None]:
    """Keep the in-process coordinator's RPC log lines out of the captured CLI output."""
    with structlog.testing.capture_logs():
        yield


def _key_file(identity: Identity, path: Path) -> Path:
    identity.save(path)
    return path


async def test_nodes_commands(
    coordinator: Coordinator,
    operator_identity: Identity,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = _key_file(operator_identity, tmp_path / "operator.key")
    target = ["--coordinator", coordinator.address, "--key", str(key), "--network-id"]
    target.append(NETWORK_ID)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        capsys.readouterr()

        # The operator key registers itself (idempotently) and lists every node.
        assert await rollnet("nodes", "list", *target) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:3] == ["NODE", "ROLE", "STATE"]
        rows = {line.split()[0]: line.split()[1:3] for line in table[1:]}
        assert rows[worker.node_id] == ["worker", "pending"]
        assert rows[operator_identity.node_id] == ["operator", "pending"]

        assert await rollnet("nodes", "list", *target, "--role", "worker", "--json") == 0
        listed = json.loads(capsys.readouterr().out)
        assert [n["node_id"] for n in listed] == [worker.node_id]
        assert listed[0]["public_key"] == worker.public_key.hex()

        assert await rollnet("nodes", "show", worker.node_id, *target) == 0
        shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
        assert shown["node_id"] == worker.node_id
        assert shown["environments"] == "arithmetic"

        # Eject: recorded with its reason, and the worker may not pull any more.
        assert (
            await rollnet("nodes", "eject", worker.node_id, "--reason", "bad proofs", *target) == 0
        )
        assert capsys.readouterr().out.strip() == f"{worker.node_id}: ejected (bad proofs)"
        with pytest.raises(RollnetError) as refused:
            await pull(client, wait=0)
        assert refused.value.reason == ErrorReason.NODE_EJECTED

        # Ban: terminal, and the key is refused everywhere.
        assert (
            await rollnet("nodes", "ban", worker.node_id, "--reason", "sybil", *target, "--json")
            == 0
        )
        assert json.loads(capsys.readouterr().out)["state"] == "banned"
        with pytest.raises(RollnetError) as refused:
            await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.reason == ErrorReason.NODE_BANNED

        # Unknown nodes and keys that are not operators are refused with their reason (exit 1).
        assert await rollnet("nodes", "show", "0" * 32, *target) == 1
        assert "NODE_NOT_FOUND" in capsys.readouterr().err
        stranger = _key_file(Identity.generate(), tmp_path / "stranger.key")
        not_operator = [a if a != str(key) else str(stranger) for a in target]
        assert await rollnet("nodes", "list", *not_operator) == 1
        refused_role = capsys.readouterr().err
        assert "ROLE_NOT_PERMITTED" in refused_role
        # The refusal says where the key goes.
        assert "operators = [...]" in refused_role
        assert "docs/coordinator.toml" in refused_role
        assert await rollnet("nodes", "list", *target[:3], str(tmp_path / "missing.key")) == 2
    finally:
        await client.close()


def _model_dir(root: Path) -> tuple[Path, int]:
    """A tiny Hugging Face style model directory; returns it and its parameter count."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (root / "pytorch_model.bin").write_bytes(b"pickles are never shipped")
    (root / "added_tokens.json").write_bytes(b"")  # empty files have no shards
    (root / "extra").mkdir()
    (root / "extra" / "merges.txt").write_text("a b\n")
    (root / ".cache").mkdir()
    (root / ".cache" / "junk.json").write_text("{}")
    rng = np.random.default_rng(0)
    tensors = {
        "embed.weight": rng.standard_normal((50, 8)).astype(np.float32),
        "layer.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "norm.weight": np.ones(8, dtype=np.float32),
    }
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root, sum(t.size for t in tensors.values())


async def test_checkpoint_publish(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, parameters = _model_dir(tmp_path / "model")
    files = model_files(model)
    published_paths = [
        "added_tokens.json",
        "config.json",
        "extra/merges.txt",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert [p.relative_to(model).as_posix() for p in files] == published_paths
    assert flops_per_token(files) == 2 * parameters

    async with running_parties(coordinator_config, trainer_identity, checkpoint=None) as parties:
        coordinator, trainer = parties.coordinator, parties.trainer
        reader, worker = parties.client, parties.worker
        published = await publish_model_dir(
            trainer, trainer_identity, model, step=1, network_id=NETWORK_ID, shard_size=1000
        )
        assert published.checkpoint.step == 1
        assert published.shards_already_present == 0

        # What a worker sees: a trainer-signed manifest whose shards rebuild every file.
        latest = await reader.checkpoints.get_latest_checkpoint(
            checkpoint_service_pb2.GetLatestCheckpointRequest()
        )
        checkpoint = latest.checkpoint
        assert checkpoint.trainer_public_key == trainer_identity.public_key
        assert verify_signature(
            trainer_identity.public_key,
            checkpoint.signature,
            b"rollnet-checkpoint-v1\n" + checkpoint.manifest,
        )
        assert CHECKPOINT_DOMAIN == b"rollnet-checkpoint-v1\n"
        manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
        assert (manifest.step, manifest.network_id) == (1, NETWORK_ID)
        assert manifest.flops_per_token == 2 * parameters
        assert [f.path for f in manifest.files] == published_paths
        for entry in manifest.files:
            original = (model / entry.path).read_bytes()
            assert entry.content.size == len(original)
            assert entry.content.blake3 == blake3.blake3(original).digest()
            assert all(s.size <= 1000 for s in entry.shards)
            pieces = [await reader.blobs.download(s.blake3) for s in entry.shards]
            assert b"".join(pieces) == original
        weights = next(f for f in manifest.files if f.path == "model.safetensors")
        assert len(weights.shards) > 1

        # The SDK's checkpoint fetcher (what workers and validators run) rebuilds the directory.
        store = CheckpointStore(
            tmp_path / "fetched",
            network_id=NETWORK_ID,
            trusted_trainer_keys=[trainer_identity.public_key],
        )
        fetched = await store.ensure(checkpoint, BlobServiceShards(reader))
        for path in published_paths:
            assert (fetched / path).read_bytes() == (model / path).read_bytes()
        assert not (fetched / "pytorch_model.bin").exists()

        # The command line publishes the same directory again: nothing new, the same manifest.
        key = tmp_path / "trainer.key"
        trainer_identity.save(key)
        target = ["--coordinator", coordinator.address, "--key", str(key)]
        target += ["--network-id", NETWORK_ID, "--model", str(model)]
        capsys.readouterr()
        assert (
            await rollnet(
                "checkpoint",
                "publish",
                *target,
                "--step",
                "1",
                "--shard-mib",
                str(1000 / 2**20),
                "--json",
            )
            == 0
        )
        summary = json.loads(capsys.readouterr().out)
        assert summary["step"] == 1
        assert summary["shards"] == summary["shards_already_present"] == published.shards_uploaded
        again = await reader.checkpoints.get_checkpoint(
            checkpoint_service_pb2.GetCheckpointRequest(step=1)
        )
        assert again.checkpoint.manifest == checkpoint.manifest

        # Steps only go forward; other keys may not publish; a directory without weights is refused.
        assert (
            await rollnet("checkpoint", "publish", *target, "--step", "1", "--shard-mib", "1") == 1
        )
        assert "CHECKPOINT_STEP_NOT_MONOTONIC" in capsys.readouterr().err
        assert await rollnet("checkpoint", "publish", *target, "--step", "2") == 0
        assert "published step 2" in capsys.readouterr().out
        intruder = tmp_path / "worker.key"
        worker.save(intruder)
        stolen = [a if a != str(key) else str(intruder) for a in target]
        assert await rollnet("checkpoint", "publish", *stolen, "--step", "3") == 1
        assert "ROLE" in capsys.readouterr().err
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text("{}")
        empty = [*target[:-1], str(tmp_path / "empty")]
        assert await rollnet("checkpoint", "publish", *empty, "--step", "3") == 2
        assert "no *.safetensors" in capsys.readouterr().err
        # Step 0 is a valid first step (the demo's); a negative one is a usage error.
        assert await rollnet("checkpoint", "publish", *target, "--step", "-1") == 2
        assert "--step: -1: step must be 0 or more" in capsys.readouterr().err


def _cli_target(coordinator: Coordinator, identity: Identity, tmp_path: Path) -> list[str]:
    """The connection options of a CLI command signing with ``identity``'s key."""
    key = _key_file(identity, tmp_path / f"{identity.node_id}.key")
    return ["--coordinator", coordinator.address, "--key", str(key), "--network-id", NETWORK_ID]


async def test_reinstating_an_ejected_node_and_no_operator_removes_itself(
    coordinator_config: CoordinatorConfig,
    operator_identity: Identity,
    trainer_identity: Identity,
    validator_identity: Identity,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with running_parties(coordinator_config, trainer_identity, validator_identity) as swarm:
        target = _cli_target(swarm.coordinator, operator_identity, tmp_path)
        worker, client = swarm.worker, swarm.client
        trainer, validator = swarm.trainer, swarm.validator
        await request_tasks(trainer, 4)
        # Three rejects eject the worker (eject_after_rejects = 3).
        for _ in range(3):
            await pull_and_commit(client, worker)
            await judge_next_job(validator, accept=False)
        refused = await client.nodes.get_node(node_service_pb2.GetNodeRequest())
        assert refused.node.state == node_pb2.Node.STATE_EJECTED

        # The operator reinstates it: OFFLINE until it heartbeats, then it works again.
        assert (
            await rollnet("nodes", "reinstate", worker.node_id, "--reason", "fixed", *target) == 0
        )
        assert capsys.readouterr().out.strip() == f"{worker.node_id}: offline (reinstated: fixed)"
        beat = await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        assert beat.state == node_pb2.Node.STATE_ACTIVE
        # Its earlier rejects are forgiven: one more reject does not eject it again at once.
        await pull_and_commit(client, worker)
        await judge_next_job(validator, accept=False)
        again = await client.nodes.get_node(node_service_pb2.GetNodeRequest())
        assert again.node.state == node_pb2.Node.STATE_ACTIVE
        # Reinstating a node that is not ejected changes nothing.
        assert (
            await rollnet("nodes", "reinstate", worker.node_id, "--reason", "again", *target) == 0
        )
        assert capsys.readouterr().out.strip().startswith(f"{worker.node_id}: active")

        # An operator cannot eject or ban itself (it would lock itself out).
        me = operator_identity.node_id
        for verb in ("eject", "ban"):
            assert await rollnet("nodes", verb, me, "--reason", "oops", *target) == 1
            err = capsys.readouterr().err
            assert f"INVALID_FIELDS: node_id: an operator cannot {verb} itself" in err
        assert await rollnet("nodes", "show", me, *target) == 0
        assert "operator" in capsys.readouterr().out

        # A ban is for good: no reinstating it.
        assert await rollnet("nodes", "ban", worker.node_id, "--reason", "sybil", *target) == 0
        capsys.readouterr()
        assert await rollnet("nodes", "reinstate", worker.node_id, "--reason", "x", *target) == 1
        assert "NODE_BANNED" in capsys.readouterr().err


async def test_rollouts_request_and_stream(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Demand and supply without code: the trainer's key asks for rollouts and reads the
    accepted ones as JSON lines."""
    async with running_parties(coordinator_config, trainer_identity, validator_identity) as swarm:
        target = _cli_target(swarm.coordinator, trainer_identity, tmp_path)
        worker, client, validator = swarm.worker, swarm.client, swarm.validator
        request = ["rollouts", "request", *target, "--prompts", "2", "--samples", "3"]
        assert await rollnet(*request, "--step", "5", "--max-new-tokens", "8", "--json") == 0
        created = json.loads(capsys.readouterr().out)
        assert len(created["task_ids"]) == 2
        assert created["checkpoint_step"] == 1
        for _ in range(2):
            await pull_and_commit(client, worker)
            await judge_next_job(validator, accept=True, reward=0.5, logprob=-0.75)
        stream = ["rollouts", "stream", *target, "--count", "6", "--idle", "30"]
        assert await rollnet(*stream) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(lines) == 6
        assert {line["task_id"] for line in lines} == set(created["task_ids"])
        assert {line["rollout_step"] for line in lines} == {5}
        assert {line["validated_reward"] for line in lines} == {0.5}
        assert {line["node_id"] for line in lines} == {worker.node_id}
        # --full: the rollout as the worker sent it, and the validator's log-probabilities (what
        # a trainer's importance ratios use, not the worker's behaviour_logprobs).
        assert await rollnet(*stream, "--full") == 0
        full = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [line["sequence"] for line in full] == [line["sequence"] for line in lines]
        assert {tuple(line["validated_logprobs"]) for line in full} == {
            (-0.75,) * COMPLETION_TOKENS
        }
        assert {len(line["rollout"]["behaviour_logprobs"]) for line in full} == {COMPLETION_TOKENS}
        # Resuming after the last sequence: nothing more arrives within --idle.
        after = ["--after", str(lines[-1]["sequence"]), "--idle", "0.5"]
        assert await rollnet("rollouts", "stream", *target, *after) == 0
        assert capsys.readouterr().out == ""
        # The stream never ends by itself: one of --count and --idle is required.
        assert await rollnet("rollouts", "stream", *target) == 2
        assert "--count N, --idle SECONDS" in capsys.readouterr().err


def test_a_model_dir_the_protocol_cannot_use_is_refused_before_any_upload(tmp_path: Path) -> None:
    """The publisher needs tokenizer.json (workers and validators tokenize with it) and applies
    the checkpoint path rule to every file it would publish, naming the file."""
    model, _ = _model_dir(tmp_path / "model")
    (model / "tokenizer.json").unlink()
    with pytest.raises(CheckpointDirError, match=r"has no tokenizer\.json"):
        model_files(model)
    (model / "tokenizer.json").write_text("{}")
    (model / "special tokens.json").write_text("{}")
    with pytest.raises(CheckpointDirError, match=r"special tokens\.json: component 1"):
        model_files(model)
    (model / "special tokens.json").unlink()
    (model / "Extra").mkdir()
    (model / "Extra" / "merges.txt").write_text("a b\n")
    with pytest.raises(CheckpointDirError, match="differs only in case"):
        model_files(model)

"""Helpers shared by the tests that run a swarm: a trainer and its demand.

Importable from every test directory (``tests/support`` is on pytest's ``pythonpath``).
Clients, the network id and waiting are :mod:`rollnet.sdk.testing`'s.
"""

from __future__ import annotations

from pathlib import Path

from rollnet.reference.checkpoints import publish_model_dir
from rollnet.sdk import Identity, RollnetClient
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2, rollout_service_pb2


async def start_trainer(
    address: str, trainer: Identity, model_dir: Path, *, shard_size: int = 256 * 1024
) -> RollnetClient:
    """Register the trainer and publish the tiny model as checkpoint 1 (small shards)."""
    client = connect(address, trainer)
    await client.nodes.register_node(
        node_service_pb2.RegisterNodeRequest(
            public_key=trainer.public_key,
            role=common_pb2.ROLE_TRAINER,
            protocol_version=common_pb2.ProtocolVersion(major=1, minor=0),
            hardware=node_pb2.HardwareReport(cpu_cores=2, memory_bytes=1 << 30),
        )
    )
    await publish_model_dir(client, trainer, model_dir, 1, NETWORK_ID, shard_size=shard_size)
    return client


async def request_tasks(
    trainer: RollnetClient,
    tasks: int,
    *,
    prompts_per_task: int = 1,
    samples: int = 2,
    max_new_tokens: int = 32,
) -> list[str]:
    """Ask for ``tasks`` tasks of the arithmetic environment; returns their ids."""
    response = await trainer.rollouts.request_rollouts(
        rollout_service_pb2.RequestRolloutsRequest(
            rollout_step=1,
            environment="arithmetic",
            prompt_count=tasks * prompts_per_task,
            samples_per_prompt=samples,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
            prompts_per_task=prompts_per_task,
        )
    )
    return list(response.task_ids)

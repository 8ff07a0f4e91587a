"""The README's worker example runs: its generator, fed a stand-in model, gets a receipt."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from worker_testing import eventually, request_tasks, start_trainer, worker_config

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk.identity import Identity
from rollnet.sdk.worker import Worker
from rollnet.v1 import rollout_pb2, task_pb2

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Using the SDK") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def stand_in_model(
    task: task_pb2.Task, prompt_index: int, sample_index: int, seed: int
) -> rollout_pb2.Rollout:
    return rollout_pb2.Rollout(
        prompt_index=prompt_index,
        prompt_id=task.prompt_ids[prompt_index],
        sample_index=sample_index,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3, 0],
        behaviour_logprobs=[-1.0, -0.5],
        sampling_seed=seed,
        finish_reason=rollout_pb2.FINISH_REASON_EOS,
    )


@pytest.mark.timeout(180)
async def test_readme_worker_example(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    code = readme_example()
    # Everything up to the lines that would connect to 127.0.0.1:7070 and block.
    namespace: dict[str, Any] = {"my_model": stand_in_model}
    exec(compile(code[: code.index("config = WorkerConfig(")], "README.md", "exec"), namespace)
    coordinator = await start_coordinator(coordinator_config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    worker = Worker(
        worker_config(coordinator.address, tmp_path / "w"),
        Identity.generate(),
        namespace["MyGenerator"](),
    )
    running = asyncio.create_task(worker.run())
    try:
        await request_tasks(trainer, 1)
        await eventually(lambda: worker.receipts_received == 1, within=60, what="a receipt")
        worker.request_stop()
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            running.cancel()
        await trainer.close()
        await coordinator.stop(grace=0.5)
